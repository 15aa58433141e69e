//! What a worker holds in the database and must either finish or give
//! back: attempts whose handler runs or whose outcome is not written yet
//! (heartbeated until it is), and claims whose answer never arrived (the
//! claim may have committed although the connection broke before the
//! reply; such tasks are released by claim token, not left to the
//! heartbeat timeout).
//!
//! An attempt whose hold the worker can no longer vouch for (see
//! worker/heartbeat.rs) is let go: its handler is asked to stop and then
//! aborted, one not started yet never starts, and its task is put back.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use crate::db::ClaimedTask;

/// Where an attempt's handler is.
enum Handler {
    /// Not started (claimed ahead, waiting for a slot).
    Waiting,
    /// Running: the first aborts it; the second says whether it completed
    /// the task in its own transaction (`TaskContext::complete_in`), after
    /// which the task is done whatever becomes of the handler.
    Running(AbortHandle, Arc<AtomicBool>),
    /// Returned (or aborted): the outcome is decided.
    Ended,
}

impl Handler {
    /// Aborts a running handler (it has ended then); returns whether one
    /// ran.
    fn abort(&mut self) -> bool {
        match std::mem::replace(self, Self::Ended) {
            Self::Running(abort, _) => {
                abort.abort();
                true
            }
            other => {
                *self = other;
                false
            }
        }
    }
}

#[derive(Default)]
struct Inner {
    /// By (task id, claim token): the same task can be held twice when a
    /// claim was lost in a server crash and the task claimed again.
    attempts: HashMap<(i64, Arc<str>), Handler>,
    /// Attempts let go of: their hold could not be vouched for.
    let_go: HashSet<(i64, Arc<str>)>,
    /// Claims sent and not answered yet.
    claiming: HashSet<Arc<str>>,
    /// Claims that failed in a way that leaves their fate unknown: they may
    /// have committed without us seeing it.
    lost: HashSet<Arc<str>>,
    /// The cancellation tokens of running handlers, by task id.
    tokens: HashMap<i64, CancellationToken>,
    /// Held tasks an operator asked to cancel.
    cancel_requested: HashSet<i64>,
}

/// What a claimed attempt does when its slot comes ([`Holdings::before_start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BeforeStart {
    /// Start the handler.
    Run,
    /// Let go of: it never starts, and goes back.
    LetGo,
    /// An operator cancelled its task: it never starts, and ends cancelled.
    Cancelled,
}
/// Shared between the producers, executor, completer and heartbeat.
pub(crate) struct Holdings {
    inner: Mutex<Inner>,
    /// This run of the worker: its id and a random per-run value, so that
    /// neither claim tokens nor the lease holder repeat across restarts of
    /// a worker that was given a fixed id.
    run_id: String,
    next_token: AtomicU64,
}

impl Holdings {
    pub(crate) fn new(worker_id: &str) -> Self {
        let run = crate::random::u64() & 0xffff_ffff;
        Self {
            inner: Mutex::default(),
            run_id: format!("{worker_id}/{run:08x}"),
            next_token: AtomicU64::new(1),
        }
    }

    /// This run of the worker (`worker id/random`).
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh claim token, recorded until [`Self::settle`] or
    /// [`Self::lost`]: call before sending the claim, so that a claim
    /// abandoned half-way (shutdown) is still released at exit.
    pub(crate) fn begin_claim(&self) -> Arc<str> {
        let n = self.next_token.fetch_add(1, Ordering::Relaxed);
        let token: Arc<str> = Arc::from(format!("{}/{n}", self.run_id));
        self.lock().claiming.insert(Arc::clone(&token));
        token
    }

    /// The claim's answer arrived: its tasks (if any, with their runs) are
    /// held from now on.
    pub(crate) fn settle(&self, token: &Arc<str>, tasks: &[ClaimedTask]) {
        let mut inner = self.lock();
        inner.claiming.remove(token);
        for held in tasks.iter().flat_map(ClaimedTask::held) {
            inner.attempts.insert(held, Handler::Waiting);
        }
    }

    /// The claim's statement failed: after a transient error its fate is
    /// unknown and its token must be released ([`Self::lost`]); a refused
    /// statement claimed nothing.
    pub(crate) fn claim_failed(&self, token: &Arc<str>, error: &sqlx::Error) {
        if crate::db::classify::is_transient(error) {
            self.lost(token);
        } else {
            self.settle(token, &[]);
        }
    }

    /// The claim failed without a clear answer (a transient error): it may
    /// have committed, so its token must be released.
    fn lost(&self, token: &Arc<str>) {
        let mut inner = self.lock();
        inner.claiming.remove(token);
        inner.lost.insert(Arc::clone(token));
    }

    /// Tokens of lost claims (to release before claiming again).
    pub(crate) fn lost_claims(&self) -> Vec<Arc<str>> {
        self.lock().lost.iter().cloned().collect()
    }

    /// These lost claims were released.
    pub(crate) fn forget_claims(&self, tokens: &[Arc<str>]) {
        let mut inner = self.lock();
        for t in tokens {
            inner.lost.remove(t);
        }
    }

    /// The handler of an attempt started; shutdown may abort it, and an
    /// operator's cancel fires `cancel`. `completed_in` turns true once it
    /// completed the task in its own transaction.
    pub(crate) fn running(
        &self,
        id: i64,
        token: &Arc<str>,
        abort: AbortHandle,
        cancel: CancellationToken,
        completed_in: Arc<AtomicBool>,
    ) {
        let mut inner = self.lock();
        let key = (id, Arc::clone(token));
        if let Some(a) = inner.attempts.get_mut(&key) {
            *a = Handler::Running(abort, completed_in);
            if inner.cancel_requested.contains(&id) || inner.let_go.contains(&key) {
                cancel.cancel();
            }
            inner.tokens.insert(id, cancel);
        }
    }

    /// The handler of an attempt returned; its outcome is on its way.
    /// Returns whether the worker let go of the attempt.
    pub(crate) fn ran(&self, id: i64, token: &Arc<str>) -> bool {
        let mut inner = self.lock();
        let key = (id, Arc::clone(token));
        if let Some(a) = inner.attempts.get_mut(&key) {
            *a = Handler::Ended;
        }
        inner.tokens.remove(&id);
        inner.let_go.contains(&key)
    }

    /// Lets go of every attempt whose handler has not ended (`only`: of
    /// those among these task ids): running handlers are asked to stop
    /// (their cancellation token fires), waiting ones will not start. A
    /// handler that completed its task in its own transaction is left to
    /// finish: the task is done. Returns how many were newly let go of.
    pub(crate) fn let_go(&self, only: Option<&HashSet<i64>>) -> usize {
        let mut inner = self.lock();
        let Inner {
            attempts,
            let_go,
            tokens,
            ..
        } = &mut *inner;
        let mut n = 0;
        for (key, handler) in attempts.iter() {
            let done = match handler {
                Handler::Ended => true,
                Handler::Running(_, completed_in) => completed_in.load(Ordering::SeqCst),
                Handler::Waiting => false,
            };
            if done || only.is_some_and(|ids| !ids.contains(&key.0)) || !let_go.insert(key.clone())
            {
                continue;
            }
            n += 1;
            if let Some(token) = tokens.get(&key.0) {
                token.cancel();
            }
        }
        n
    }

    /// Whether a claimed attempt may start its handler: not if it was let
    /// go of ([`Self::let_go`]) or an operator asked to cancel its task
    /// meanwhile. One look, under one lock, on every task's way in.
    pub(crate) fn before_start(&self, id: i64, token: &Arc<str>) -> BeforeStart {
        let inner = self.lock();
        if inner.let_go.contains(&(id, Arc::clone(token))) {
            BeforeStart::LetGo
        } else if inner.cancel_requested.contains(&id) {
            BeforeStart::Cancelled
        } else {
            BeforeStart::Run
        }
    }

    /// Aborts the handlers of attempts let go of that still run; returns
    /// how many.
    pub(crate) fn abort_let_go(&self) -> usize {
        let mut inner = self.lock();
        let Inner {
            attempts, let_go, ..
        } = &mut *inner;
        let mut aborted = 0;
        for key in let_go.iter() {
            if let Some(handler) = attempts.get_mut(key) {
                aborted += usize::from(handler.abort());
            }
        }
        aborted
    }

    /// An operator asked to cancel task `id`: if this worker holds it, its
    /// handler's token fires and its outcome will be "cancelled". Returns
    /// whether the task is held here.
    pub(crate) fn request_cancel(&self, id: i64) -> bool {
        let mut inner = self.lock();
        if !inner.attempts.keys().any(|(held, _)| *held == id) {
            return false;
        }
        inner.cancel_requested.insert(id);
        if let Some(token) = inner.tokens.get(&id) {
            token.cancel();
        }
        true
    }

    /// Whether an operator asked to cancel task `id`.
    pub(crate) fn cancel_requested(&self, id: i64) -> bool {
        self.lock().cancel_requested.contains(&id)
    }

    /// The attempt's outcome was written (or fenced out, or given up): the
    /// worker no longer holds the task.
    pub(crate) fn done(&self, id: i64, token: &Arc<str>) {
        let mut inner = self.lock();
        let key = (id, Arc::clone(token));
        inner.attempts.remove(&key);
        inner.let_go.remove(&key);
        // Called for every task: look through the attempts only in the rare
        // case that a cancel is pending.
        if inner.cancel_requested.contains(&id)
            && !inner.attempts.keys().any(|(held, _)| *held == id)
        {
            inner.cancel_requested.remove(&id);
        }
    }

    /// Held attempts: task ids and the distinct claim tokens, for the
    /// heartbeat.
    pub(crate) fn heartbeat_targets(&self) -> (Vec<i64>, Vec<Arc<str>>) {
        let inner = self.lock();
        let ids = inner.attempts.keys().map(|(id, _)| *id).collect();
        let tokens: HashSet<&Arc<str>> = inner.attempts.keys().map(|(_, t)| t).collect();
        (ids, tokens.into_iter().cloned().collect())
    }

    /// Aborts every handler still running; returns how many.
    pub(crate) fn abort_running(&self) -> usize {
        let mut inner = self.lock();
        let mut aborted = 0;
        for handler in inner.attempts.values_mut() {
            aborted += usize::from(handler.abort());
        }
        aborted
    }

    /// Every claim token under which this worker may still hold a task.
    pub(crate) fn all_tokens(&self) -> Vec<Arc<str>> {
        let inner = self.lock();
        let mut tokens: HashSet<Arc<str>> = inner.claiming.union(&inner.lost).cloned().collect();
        tokens.extend(inner.attempts.keys().map(|(_, t)| Arc::clone(t)));
        tokens.into_iter().collect()
    }

    /// Ids of the held attempts, sorted (for logs).
    pub(crate) fn held_ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.lock().attempts.keys().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids
    }

    /// Forgets everything (after a final release).
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.attempts.clear();
        inner.let_go.clear();
        inner.claiming.clear();
        inner.lost.clear();
    }

    /// Held attempts.
    pub(crate) fn len(&self) -> usize {
        self.lock().attempts.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use tokio_util::sync::CancellationToken;

    use super::{BeforeStart, Handler, Holdings};

    /// Holds task `id` under `token`, its handler not started.
    fn hold(h: &Holdings, id: i64, token: &Arc<str>) {
        h.lock()
            .attempts
            .insert((id, Arc::clone(token)), Handler::Waiting);
    }

    #[tokio::test]
    async fn letting_go_stops_what_runs_or_waits_and_spares_what_ended_or_completed_itself() {
        let h = Holdings::new("w");
        let token: Arc<str> = Arc::from("w/1");
        for id in 1..=5 {
            hold(&h, id, &token);
        }
        // 1 waits; 2 runs; 3 runs and completed its task itself; 4 ended;
        // 5 runs but is not among the ids let go of below.
        let mut running = Vec::new();
        for (id, completed) in [(2, false), (3, true), (5, false)] {
            let handler = tokio::spawn(std::future::pending::<()>());
            let cancel = CancellationToken::new();
            h.running(
                id,
                &token,
                handler.abort_handle(),
                cancel.clone(),
                Arc::new(AtomicBool::new(completed)),
            );
            running.push((id, handler, cancel));
        }
        h.ran(4, &token);

        let only: HashSet<i64> = (1..=4).collect();
        assert_eq!(h.let_go(Some(&only)), 2, "1 and 2");
        assert_eq!(h.let_go(Some(&only)), 0, "once each");
        let let_go: Vec<bool> = (1..=5)
            .map(|id| h.before_start(id, &token) == BeforeStart::LetGo)
            .collect();
        assert_eq!(let_go, [true, true, false, false, false]);
        let told: Vec<(i64, bool)> = running
            .iter()
            .map(|(id, _, cancel)| (*id, cancel.is_cancelled()))
            .collect();
        assert_eq!(told, [(2, true), (3, false), (5, false)]);

        // Only the running handler let go of is aborted.
        assert_eq!(h.abort_let_go(), 1);
        for (id, handler, _) in running {
            if id == 2 {
                assert!(handler.await.is_err_and(|e| e.is_cancelled()));
            } else {
                assert!(!handler.is_finished(), "task {id}");
                handler.abort();
            }
        }
        // An attempt let go of is forgotten with it.
        h.done(1, &token);
        assert_ne!(h.before_start(1, &token), BeforeStart::LetGo);
    }
}
