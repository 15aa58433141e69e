//! Inserting batches that hold unique tasks: which were inserted, which
//! were duplicates, and the id each duplicate maps to.

use std::collections::HashMap;

use sqlx::{PgConnection, Row};

use super::NewTask;

/// How often the insert is tried again for duplicates whose holder left
/// the covered states before its id could be read.
const ATTEMPTS: usize = 5;

/// Inserts `tasks` (some unique) on the caller's connection; returns, in
/// input order, each task's id and whether it was a duplicate.
pub(crate) async fn insert(
    conn: &mut PgConnection,
    tasks: Vec<NewTask>,
    notify: Vec<String>,
) -> sqlx::Result<Vec<(i64, bool)>> {
    let mut results: Vec<Option<(i64, bool)>> = vec![None; tasks.len()];
    let mut todo: Vec<usize> = (0..tasks.len()).collect();
    let mut notify = notify;
    for _ in 0..ATTEMPTS {
        let batch: Vec<&NewTask> = todo.iter().map(|&i| &tasks[i]).collect();
        let (keys, inserted) = insert_once(conn, &batch, std::mem::take(&mut notify)).await?;
        // Inserted rows: those without a key in id order, and by key.
        let mut plain = inserted
            .iter()
            .filter(|(_, k)| k.is_none())
            .map(|(id, _)| *id);
        let mut fresh: HashMap<&str, i64> = inserted
            .iter()
            .filter_map(|(id, k)| k.as_deref().map(|k| (k, *id)))
            .collect();
        let mut taken: HashMap<String, i64> = HashMap::new();
        let mut missing: Vec<(usize, String)> = Vec::new();
        for (pos, key) in keys.iter().enumerate() {
            let i = todo[pos];
            match key {
                None => {
                    let id = plain.next().ok_or_else(|| {
                        sqlx::Error::Protocol("a task without a unique key was not inserted".into())
                    })?;
                    results[i] = Some((id, false));
                }
                Some(key) => {
                    if let Some(id) = fresh.remove(key.as_str()) {
                        // The first task with this key in the batch.
                        taken.insert(key.clone(), id);
                        results[i] = Some((id, false));
                    } else if let Some(id) = taken.get(key) {
                        results[i] = Some((*id, true));
                    } else {
                        missing.push((i, key.clone()));
                    }
                }
            }
        }
        if missing.is_empty() {
            break;
        }
        // Held by tasks already in the table: read their ids (a new
        // statement sees what committed meanwhile).
        let wanted: Vec<&str> = missing.iter().map(|(_, k)| k.as_str()).collect();
        let holders: HashMap<String, i64> = sqlx::query(include_str!("sql/find_unique.sql"))
            .bind(&wanted)
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("unique_key")?, r.try_get("id")?)))
            .collect::<sqlx::Result<_>>()?;
        todo.clear();
        for (i, key) in missing {
            match holders.get(&key) {
                Some(id) => results[i] = Some((*id, true)),
                // Its holder finished in between: try inserting it again.
                None => todo.push(i),
            }
        }
        if todo.is_empty() {
            break;
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.ok_or_else(|| {
                sqlx::Error::Protocol(
                    "a unique task's key kept changing hands during the insert; submit it again"
                        .into(),
                )
            })
        })
        .collect()
}

/// One insert statement: every input's full key (in input order) and the
/// inserted rows (id, key) in id order.
async fn insert_once(
    conn: &mut PgConnection,
    tasks: &[&NewTask],
    notify: Vec<String>,
) -> sqlx::Result<(Vec<Option<String>>, Vec<(i64, Option<String>)>)> {
    let rows = sqlx::query(include_str!("sql/insert_unique_tasks.sql"))
        .bind(
            tasks
                .iter()
                .map(|t| t.task_type.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(tasks.iter().map(|t| t.queue.as_str()).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.payload.as_str()).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.priority).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.max_attempts).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.run_at).collect::<Vec<_>>())
        .bind(tasks.iter().map(|t| t.delay_us).collect::<Vec<_>>())
        .bind(notify)
        .bind(
            tasks
                .iter()
                .map(|t| t.unique.as_ref().map(|u| u.key.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            tasks
                .iter()
                .map(|t| t.unique.as_ref().map(|u| u.states))
                .collect::<Vec<_>>(),
        )
        .bind(
            tasks
                .iter()
                .map(|t| t.unique.as_ref().and_then(|u| u.period_us))
                .collect::<Vec<_>>(),
        )
        .bind(
            tasks
                .iter()
                .map(|t| t.ordering_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(tasks.iter().map(|t| t.skip_dead).collect::<Vec<_>>())
        .fetch_all(conn)
        .await?;
    let mut keys: Vec<(i64, Option<String>)> = Vec::with_capacity(tasks.len());
    let mut inserted = Vec::new();
    for r in &rows {
        let ord: Option<i64> = r.try_get("ord")?;
        let key: Option<String> = r.try_get("key")?;
        match ord {
            Some(ord) => keys.push((ord, key)),
            None => inserted.push((r.try_get::<i64, _>("id")?, key)),
        }
    }
    keys.sort_by_key(|(ord, _)| *ord);
    inserted.sort_by_key(|(id, _)| *id);
    Ok((keys.into_iter().map(|(_, k)| k).collect(), inserted))
}
