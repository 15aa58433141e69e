//! LISTENs for the NOTIFY that submit sends at commit (and for operators'
//! cancels of running tasks, on the control channel) and wakes the
//! producer of the named queue. A lost connection is re-established, and
//! every producer is woken then, since notifications sent meanwhile are lost
//! (the fallback poll would find those tasks too, only later).
//!
//! A LISTEN connection is idle by nature, so a half-open one would wait
//! forever: when nothing has arrived for a while the listener pings the
//! server under a deadline and starts over on a new connection if the ping
//! goes unanswered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener};
use tokio_util::sync::CancellationToken;

use super::outage::Outage;
use super::wake::{QueueWaker, Wakers};
use crate::db::{CONTROL_CHANNEL, NOTIFY_CHANNEL};

/// What the listener does with an operator's cancel of a task.
pub(crate) type OnCancel = Arc<dyn Fn(i64) + Send + Sync>;
use crate::db::classify::deadline_exceeded;
use crate::db::session::listener_pool;

pub(crate) async fn run(
    options: PgConnectOptions,
    deadline: Duration,
    ping_every: Duration,
    wakers: Wakers,
    on_cancel: OnCancel,
    stop: CancellationToken,
) {
    let wake_all = || wakers.values().for_each(|w| w.notify_one());
    let mut outage = Outage::new("listener");
    loop {
        let error = tokio::select! {
            e = listen(&options, deadline, ping_every, &wakers, &on_cancel, &mut outage) => e,
            () = stop.cancelled() => return,
        };
        // Whatever was notified while we were away is found by this wake-up.
        wake_all();
        let backoff = outage.failed(&error);
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Connects, LISTENs and forwards notifications until the connection fails
/// or stops answering; returns why.
async fn listen(
    options: &PgConnectOptions,
    deadline: Duration,
    ping_every: Duration,
    wakers: &HashMap<String, Arc<QueueWaker>>,
    on_cancel: &OnCancel,
    outage: &mut Outage,
) -> sqlx::Error {
    // A pool of its own per connection: dropping it (and the listener)
    // closes the session without sqlx's release ping.
    let pool = listener_pool(options, deadline);
    let connected = tokio::time::timeout(deadline, async {
        let mut listener = PgListener::connect_with(&pool).await?;
        listener
            .listen_all([NOTIFY_CHANNEL, CONTROL_CHANNEL])
            .await?;
        Ok::<_, sqlx::Error>(listener)
    })
    .await;
    let mut listener = match connected {
        Ok(Ok(l)) => l,
        Ok(Err(error)) => return error,
        Err(_) => return deadline_exceeded("listen", deadline),
    };
    // Reconnecting is ours to do (with a deadline, and a wake-up after).
    listener.eager_reconnect(false);
    outage.ok();
    for waker in wakers.values() {
        waker.notify_one();
    }
    loop {
        match tokio::time::timeout(ping_every, listener.try_recv()).await {
            Ok(Ok(Some(notification))) => {
                if notification.channel() == CONTROL_CHANNEL {
                    if let Some(id) = notification
                        .payload()
                        .strip_prefix("cancel:")
                        .and_then(|id| id.parse().ok())
                    {
                        on_cancel(id);
                    }
                } else if let Some(waker) = wakers.get(notification.payload()) {
                    waker.notify_one();
                }
            }
            Ok(Ok(None)) => {
                return sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into());
            }
            Ok(Err(error)) => return error,
            Err(_) => {
                // Quiet for a while: make sure the server is still there.
                let ping = sqlx::query("SELECT 1").execute(&mut listener);
                match tokio::time::timeout(deadline, ping).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return error,
                    Err(_) => return deadline_exceeded("listener ping", deadline),
                }
            }
        }
    }
}
