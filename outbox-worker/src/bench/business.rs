//! What writing the outbox row costs the application's own transaction:
//! `submitters` clients each run `BEGIN; INSERT an order; COMMIT`, and the
//! same with one `submit` added before the COMMIT. A third kind adds a
//! second order row instead of the submit: the cost of writing any one
//! more row in the transaction, the floor a submit can be held to. The
//! kinds alternate in short rounds, so that a slow spell of the shared
//! machine falls on all alike; the figures are the totals of each kind
//! over all rounds.

use std::time::Instant;

use clap::Args;
use outbox::TaskOptions;
use serde::Serialize;
use sqlx::PgPool;

use super::{Bench, Latency, SUBMIT_QUEUE, db};
use crate::builtin::Noop;
use crate::failure::Failure;
use crate::flags;

/// The business-transaction phase's flags.
#[derive(Debug, Args)]
pub(crate) struct BusinessArgs {
    /// Transactions of each kind (plain, and with a submit) in the business
    /// transaction phase (0 skips it).
    #[arg(long, default_value_t = 20_000, value_parser = flags::count(0, 100_000_000))]
    business_txs: usize,
}

/// Alternating rounds of each kind.
const ROUNDS: usize = 10;

/// What the phase measured.
#[derive(Debug, Serialize)]
pub(crate) struct BusinessReport {
    clients: usize,
    transactions_each: usize,
    plain_tx_per_s: f64,
    with_submit_tx_per_s: f64,
    /// With a submit over without: 1.0 means no cost.
    throughput_ratio: f64,
    plain_ms: Latency,
    with_submit_ms: Latency,
    /// How much higher the p50 and p99 latency are with a submit, in %.
    p50_overhead_pct: f64,
    p99_overhead_pct: f64,
    /// The control: a second order row instead of the submit.
    with_second_row_tx_per_s: f64,
    with_second_row_ms: Latency,
    /// With a submit over with a second order row: 1.0 means a submit
    /// costs the transaction what any one-row insert costs.
    submit_vs_second_row: f64,
}

/// The application's table: a primary key and one secondary index, like a
/// typical orders table.
pub(crate) const CREATE_ORDERS: &str = "
CREATE TABLE IF NOT EXISTS bench_orders (
    id bigserial PRIMARY KEY,
    customer_id bigint NOT NULL,
    amount_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bench_orders_customer_idx ON bench_orders (customer_id);
TRUNCATE bench_orders;";

pub(crate) async fn measure(bench: &Bench) -> Result<Option<BusinessReport>, Failure> {
    let total = bench.args.business.business_txs;
    if total == 0 {
        return Ok(None);
    }
    sqlx::raw_sql(CREATE_ORDERS)
        .execute(&bench.pool)
        .await
        .map_err(db)?;
    let clients = bench.args.submitters.max(1);
    let per_round = total.div_ceil(ROUNDS);
    // A warm-up round of each, not counted.
    for extra in [Extra::None, Extra::Submit, Extra::SecondRow] {
        run_round(&bench.pool, clients, per_round / 4 + 1, extra).await?;
    }
    let mut kinds = [Kind::default(), Kind::default(), Kind::default()];
    for round in 0..ROUNDS {
        // Rotate which kind goes first, too.
        for k in 0..3 {
            let extra = [Extra::None, Extra::Submit, Extra::SecondRow][(round + k) % 3];
            let (seconds, ms) = run_round(&bench.pool, clients, per_round, extra).await?;
            let kind = &mut kinds[extra as usize];
            kind.seconds += seconds;
            kind.ms.extend(ms);
        }
    }
    let [plain, with, second] = kinds;
    sqlx::raw_sql("DROP TABLE bench_orders")
        .execute(&bench.pool)
        .await
        .map_err(db)?;
    bench.reset().await?;
    let (plain_rate, with_rate, second_rate) = (plain.rate(), with.rate(), second.rate());
    let (plain_ms, with_ms) = (Latency::of(plain.ms), Latency::of(with.ms));
    let pct = |with: f64, plain: f64| (with / plain.max(1e-9) - 1.0) * 100.0;
    let report = BusinessReport {
        clients,
        transactions_each: per_round * ROUNDS,
        plain_tx_per_s: plain_rate,
        with_submit_tx_per_s: with_rate,
        throughput_ratio: with_rate / plain_rate.max(1e-9),
        p50_overhead_pct: pct(with_ms.p50, plain_ms.p50),
        p99_overhead_pct: pct(with_ms.p99, plain_ms.p99),
        plain_ms,
        with_submit_ms: with_ms,
        with_second_row_tx_per_s: second_rate,
        with_second_row_ms: Latency::of(second.ms),
        submit_vs_second_row: with_rate / second_rate.max(1e-9),
    };
    bench.say(format!(
        "business transaction (BEGIN; INSERT order; COMMIT) from {clients} clients, {} each:\n  \
         plain {:.0} tx/s, {}\n  with a submit {:.0} tx/s, {}\n  throughput {:.3}x, p50 {:+.1}%, p99 {:+.1}%\n  \
         control, a second order row instead: {:.0} tx/s, {} (submit / second row: {:.3}x)",
        report.transactions_each,
        report.plain_tx_per_s,
        report.plain_ms,
        report.with_submit_tx_per_s,
        report.with_submit_ms,
        report.throughput_ratio,
        report.p50_overhead_pct,
        report.p99_overhead_pct,
        report.with_second_row_tx_per_s,
        report.with_second_row_ms,
        report.submit_vs_second_row,
    ));
    Ok(Some(report))
}

/// What each transaction adds to its order row.
#[derive(Clone, Copy)]
enum Extra {
    None = 0,
    Submit = 1,
    SecondRow = 2,
}

#[derive(Default)]
struct Kind {
    seconds: f64,
    ms: Vec<f64>,
}

impl Kind {
    fn rate(&self) -> f64 {
        self.ms.len() as f64 / self.seconds.max(1e-9)
    }
}

/// `count` transactions over `clients` connections; the round's wall time
/// and each transaction's latency in ms.
async fn run_round(
    pool: &PgPool,
    clients: usize,
    count: usize,
    extra: Extra,
) -> Result<(f64, Vec<f64>), Failure> {
    let started = Instant::now();
    let mut handles = Vec::new();
    for c in 0..clients {
        let pool = pool.clone();
        let share = count / clients + usize::from(c < count % clients);
        handles.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let mut ms = Vec::with_capacity(share);
            for i in 0..share {
                let customer = (c * 1_000_003 + i) as i64 % 10_000;
                let t = Instant::now();
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                insert_order(&mut tx, customer).await?;
                match extra {
                    Extra::None => {}
                    Extra::Submit => {
                        outbox::submit_with(
                            &mut tx,
                            Noop {},
                            TaskOptions::new().queue(SUBMIT_QUEUE),
                        )
                        .await?;
                    }
                    Extra::SecondRow => insert_order(&mut tx, customer).await?,
                }
                tx.commit().await?;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, outbox::Error>(ms)
        }));
    }
    let mut all = Vec::with_capacity(count);
    for h in handles {
        all.extend(h.await.map_err(Failure::runtime)??);
    }
    Ok((started.elapsed().as_secs_f64(), all))
}

pub(crate) async fn insert_order(conn: &mut sqlx::PgConnection, customer: i64) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO bench_orders (customer_id, amount_cents) VALUES ($1, $2)")
        .bind(customer)
        .bind(1999_i64)
        .execute(conn)
        .await
        .map(drop)
}
