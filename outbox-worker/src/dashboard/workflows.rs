//! The workflows pages: the latest workflows, and one workflow drawn as a
//! graph (a column per depth, a box per step coloured by its state, a line
//! per dependency) with its steps' table and a cancel button.

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use outbox::WorkflowId;
use outbox::workflow::{StepStatus, WorkflowStatus, WorkflowSummary};

use super::Dashboard;
use super::auth::{CsrfToken, Identity, check_csrf};
use super::pages::{TokenForm, query, writable};
use super::views::{Refusal, render, when};

/// Workflows listed at most.
const LISTED: i64 = 200;

/// The most steps drawn as a graph (a wider workflow is shown as a table).
pub(crate) const MAX_DRAWN: usize = 300;

const NODE_W: i64 = 170;
const NODE_H: i64 = 40;
const COLUMN: i64 = 220;
const ROW: i64 = 56;
const MARGIN: i64 = 10;

#[derive(Template)]
#[template(path = "workflows.html")]
pub(crate) struct WorkflowsPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) workflows: Vec<WorkflowSummary>,
}

impl WorkflowsPage<'_> {
    fn created(&self, w: &WorkflowSummary) -> String {
        when(Some(&w.created_at))
    }
}

#[derive(Template)]
#[template(path = "workflow.html")]
pub(crate) struct WorkflowPage<'a> {
    pub(crate) base: &'a str,
    pub(crate) csrf: &'a str,
    pub(crate) read_only: bool,
    pub(crate) status: WorkflowStatus,
    pub(crate) graph: Option<Graph>,
}

impl WorkflowPage<'_> {
    fn finished(&self) -> String {
        when(self.status.workflow.finished_at.as_ref())
    }

    fn cancelled(&self) -> String {
        when(self.status.workflow.cancelled_at.as_ref())
    }

    fn open(&self) -> bool {
        self.status.workflow.finished_at.is_none()
    }
}

/// A workflow laid out for SVG.
#[derive(Debug, PartialEq)]
pub(crate) struct Graph {
    pub(crate) width: i64,
    pub(crate) height: i64,
    pub(crate) nodes: Vec<Node>,
    pub(crate) edges: Vec<Edge>,
}

/// One step's box.
#[derive(Debug, PartialEq)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) label: String,
    pub(crate) state: String,
    pub(crate) x: i64,
    pub(crate) y: i64,
    pub(crate) task_id: Option<i64>,
}

/// One dependency's line, from the parent's right side to the child's left.
#[derive(Debug, PartialEq)]
pub(crate) struct Edge {
    pub(crate) x1: i64,
    pub(crate) y1: i64,
    pub(crate) x2: i64,
    pub(crate) y2: i64,
}

/// Places each step in the column of its depth (the longest chain of
/// dependencies above it), in the order the steps were added within a
/// column. Compensations form their own chain, depth 0 up.
pub(crate) fn layout(steps: &[StepStatus]) -> Graph {
    let index: HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut depth: Vec<Option<i64>> = vec![None; steps.len()];
    // Relaxation in rounds; a graph from the database has no cycle, and the
    // bound keeps a corrupted one from looping.
    for _ in 0..=steps.len() {
        let mut changed = false;
        for (i, s) in steps.iter().enumerate() {
            let mut d = Some(0);
            for p in &s.after {
                d = match (d, index.get(p.as_str()).and_then(|&j| depth[j])) {
                    (Some(d), Some(pd)) => Some(d.max(pd + 1)),
                    _ => None,
                };
            }
            if d.is_some() && d != depth[i] {
                depth[i] = d;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut rows: HashMap<i64, i64> = HashMap::new();
    let mut place: Vec<(i64, i64)> = Vec::with_capacity(steps.len());
    let mut nodes = Vec::with_capacity(steps.len());
    for (i, s) in steps.iter().enumerate() {
        let d = depth[i].unwrap_or(0);
        let row = rows.entry(d).or_insert(0);
        let (x, y) = (MARGIN + d * COLUMN, MARGIN + *row * ROW);
        *row += 1;
        place.push((x, y));
        let mut label: String = s.name.chars().take(22).collect();
        if label.len() < s.name.len() {
            label.push('…');
        }
        nodes.push(Node {
            name: s.name.clone(),
            label,
            state: s
                .task_state
                .clone()
                .filter(|_| s.state == "released")
                .unwrap_or_else(|| s.state.clone()),
            x,
            y,
            task_id: s.task_id.map(|t| t.0),
        });
    }
    let mut edges = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        for p in &s.after {
            if let Some(&j) = index.get(p.as_str()) {
                let (px, py) = place[j];
                let (cx, cy) = place[i];
                edges.push(Edge {
                    x1: px + NODE_W,
                    y1: py + NODE_H / 2,
                    x2: cx,
                    y2: cy + NODE_H / 2,
                });
            }
        }
    }
    let columns = depth.iter().map(|d| d.unwrap_or(0)).max().unwrap_or(0) + 1;
    let tallest = rows.values().copied().max().unwrap_or(1);
    Graph {
        width: 2 * MARGIN + (columns - 1) * COLUMN + NODE_W,
        height: 2 * MARGIN + (tallest - 1) * ROW + NODE_H,
        nodes,
        edges,
    }
}

pub(crate) async fn list(State(d): State<Arc<Dashboard>>) -> Response {
    let result = async {
        let workflows = query("workflows", outbox::workflow::list(&d.pool, None, LISTED)).await?;
        Ok::<_, Refusal>(render(
            StatusCode::OK,
            &WorkflowsPage {
                base: &d.config.base_path,
                workflows,
            },
        ))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

pub(crate) async fn show(
    State(d): State<Arc<Dashboard>>,
    Extension(csrf): Extension<CsrfToken>,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let id = parse_id(&id)?;
        let Some(status) = query(
            "workflow",
            outbox::workflow::workflow_status(&d.pool, WorkflowId(id)),
        )
        .await?
        else {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no workflow with id {id}"),
            ));
        };
        let graph = (status.step_list.len() <= MAX_DRAWN).then(|| layout(&status.step_list));
        Ok(render(
            StatusCode::OK,
            &WorkflowPage {
                base: &d.config.base_path,
                csrf: &csrf.0,
                read_only: d.config.read_only,
                status,
                graph,
            },
        ))
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

pub(crate) async fn cancel(
    State(d): State<Arc<Dashboard>>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<TokenForm>,
) -> Response {
    let result = async {
        writable(&d)?;
        check_csrf(identity, &headers, &form.csrf)?;
        let id = parse_id(&id)?;
        if query("cancel", outbox::workflow::cancel(&d.pool, WorkflowId(id)))
            .await?
            .is_none()
        {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no workflow with id {id}"),
            ));
        }
        Ok(Redirect::to(&format!("{}/workflows/{id}", d.config.base_path)).into_response())
    }
    .await;
    result.unwrap_or_else(|refused| refused.page(&d.config))
}

fn parse_id(id: &str) -> Result<i64, Refusal> {
    id.parse::<i64>().map_err(|_| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a workflow id (a whole number)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str, after: &[&str], state: &str) -> StepStatus {
        StepStatus {
            name: name.to_owned(),
            state: state.to_owned(),
            task_type: "t".to_owned(),
            after: after.iter().map(|s| (*s).to_owned()).collect(),
            task_id: None,
            task_state: None,
            due_at: None,
            retry_count: None,
            last_error: None,
            compensates: None,
            has_compensation: false,
            finished_at: None,
            result: None,
        }
    }

    #[test]
    fn steps_sit_in_the_column_of_their_longest_chain() {
        // Added out of order: the chord first.
        let steps = [
            step("sum", &["a", "b"], "waiting"),
            step("a", &["root"], "completed"),
            step("root", &[], "completed"),
            step("b", &["root"], "dead"),
        ];
        let g = layout(&steps);
        let at = |name: &str| {
            let n = g.nodes.iter().find(|n| n.name == name).unwrap();
            (n.x, n.y)
        };
        assert_eq!(at("root"), (MARGIN, MARGIN));
        assert_eq!(at("a"), (MARGIN + COLUMN, MARGIN));
        assert_eq!(at("b"), (MARGIN + COLUMN, MARGIN + ROW));
        assert_eq!(at("sum"), (MARGIN + 2 * COLUMN, MARGIN));
        assert_eq!(g.edges.len(), 4);
        assert_eq!(g.width, 2 * MARGIN + 2 * COLUMN + NODE_W);
        assert_eq!(g.height, 2 * MARGIN + ROW + NODE_H);
        assert_eq!(g.nodes[3].state, "dead");
    }

    #[test]
    fn a_cycle_or_an_unknown_parent_is_drawn_without_looping() {
        let g = layout(&[
            step("a", &["b"], "waiting"),
            step("b", &["a"], "waiting"),
            step("c", &["ghost"], "waiting"),
        ]);
        assert_eq!(g.nodes.len(), 3);
        assert_eq!(g.edges.len(), 2);
    }
}
