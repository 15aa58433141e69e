//! LISTENs for the NOTIFY that submit sends at commit and wakes the
//! producer of the named queue. A lost connection is re-established, and
//! every producer is woken then, since notifications sent meanwhile are lost
//! (the fallback poll would find those tasks too, only later).

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::outage::Outage;
use crate::db::NOTIFY_CHANNEL;

pub(crate) async fn run(
    pool: PgPool,
    wakers: Arc<HashMap<String, Arc<Notify>>>,
    stop: CancellationToken,
) {
    let wake_all = || wakers.values().for_each(|w| w.notify_one());
    let mut outage = Outage::new("listener");
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(NOTIFY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            result = connected => match result {
                Ok(l) => l,
                Err(error) => {
                    let backoff = outage.failed(&error);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => continue,
                        () = stop.cancelled() => return,
                    }
                }
            },
            () = stop.cancelled() => return,
        };
        outage.ok();
        wake_all();
        loop {
            let received = tokio::select! {
                r = listener.try_recv() => r,
                () = stop.cancelled() => return,
            };
            match received {
                Ok(Some(notification)) => {
                    if let Some(waker) = wakers.get(notification.payload()) {
                        waker.notify_one();
                    }
                }
                // The connection dropped; the next try_recv reconnects.
                Ok(None) => wake_all(),
                Err(error) => {
                    let _ = outage.failed(&error);
                    break;
                }
            }
        }
    }
}
