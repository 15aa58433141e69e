//! The bench's ordering-key figures: a drain of the same number of tasks
//! spread over many keys, against the unordered drain of the same run and
//! concurrency; one hot key drained alone; and the claim statement's time
//! with and without a large backlog on one key.

use clap::Args;
use serde::Serialize;

use super::{Bench, Latency, QUEUE};
use crate::failure::Failure;
use crate::flags;

/// The ordering phase's flags.
#[derive(Debug, Args)]
pub(crate) struct OrderingArgs {
    /// Keys the ordered drain spreads its tasks over (0 skips the ordering
    /// figures).
    #[arg(long, default_value_t = 1000, value_parser = flags::count(0, 10_000_000))]
    pub(crate) ordered_keys: usize,
    /// Tasks of the one-hot-key drain (part of the ordering figures:
    /// `--ordered-keys 0` skips it with them).
    #[arg(long, default_value_t = 2000, value_parser = flags::count(1, 10_000_000))]
    hot_key_tasks: usize,
    /// Tasks waiting behind one key while the claim is timed (part of the
    /// ordering figures, like `--hot-key-tasks`).
    #[arg(long, default_value_t = 50_000, value_parser = flags::count(1, 100_000_000))]
    key_backlog: usize,
}

/// What the ordering phase measured.
#[derive(Debug, Serialize)]
pub(crate) struct OrderingReport {
    keys: usize,
    insert_tasks_per_s: f64,
    drain_tasks_per_s: f64,
    /// Over the unordered drain of the same run and concurrency.
    ratio_vs_unordered: f64,
    hot_key_tasks: usize,
    hot_key_tasks_per_s: f64,
    /// Hot-key tasks claimed by the outcome of the task before them (see
    /// the guide's hand-on), not by a claim statement.
    hot_key_handed_on: u64,
    /// Tasks of the ordered drain that ran on in a run behind an earlier
    /// task of their key (`--key-run`), with no hand-over or claim of
    /// their own.
    ordered_run_on: u64,
    /// The same for the hot key.
    hot_key_run_on: u64,
    key_backlog: usize,
    /// The claim statement (10 tasks) with 1,000 due tasks and no backlog.
    claim_ms: Latency,
    /// The same with `key_backlog` tasks waiting behind one key.
    claim_with_backlog_ms: Latency,
    /// p50 with the backlog over p50 without.
    claim_backlog_ratio: f64,
}

const CLAIM_SAMPLES: usize = 200;

pub(crate) async fn measure(bench: &Bench, unordered: f64) -> Result<OrderingReport, Failure> {
    let args = &bench.args.ordering;
    let (n, keys) = (bench.args.tasks, args.ordered_keys);
    let insert = bench
        .insert_keyed(n, |i| Some(format!("k{}", i % keys)))
        .await?;
    let drain = bench.drain_count(false, n).await?;
    let ratio = drain.rate / unordered.max(1e-9);
    bench.say(format!(
        "ordered: {n} tasks over {keys} keys, inserted at {insert:.0} tasks/s, drained at {:.0} tasks/s \
         ({ratio:.2}x the unordered drain, concurrency {}, key runs of {}; {} ran on in runs, \
         {} handed on, {} keys handed on later, {} claims carrying {} tasks, {} outcome statements)",
        drain.rate,
        bench.args.concurrency,
        bench.args.key_run,
        drain.counters.tasks_run_on,
        drain.counters.tasks_handed_on,
        drain.counters.keys_deferred,
        drain.counters.claim_queries,
        drain.counters.tasks_claimed,
        drain.counters.finish_queries
    ));

    let hot = args.hot_key_tasks;
    bench.insert_keyed(hot, |_| Some("hot".to_owned())).await?;
    let hot_drain = bench.drain_count(false, hot).await?;
    let c = &hot_drain.counters;
    bench.say(format!(
        "ordered: one hot key, {hot} tasks: {:.0} tasks/s ({} ran on in runs, {} handed on by the \
         outcome before them, {} claim statements, {} times handed on later)",
        hot_drain.rate, c.tasks_run_on, c.tasks_handed_on, c.claim_queries, c.keys_deferred
    ));

    bench.insert(1000).await?;
    bench.vacuum().await?;
    let claim = claim_times(bench).await?;
    let backlog = args.key_backlog;
    bench
        .insert_keyed(backlog, |_| Some("backlog".to_owned()))
        .await?;
    bench.vacuum().await?;
    let with_backlog = claim_times(bench).await?;
    let backlog_ratio = with_backlog.p50 / claim.p50.max(1e-9);
    bench.say(format!(
        "ordered: claim of 10 with 1000 due tasks: {claim}\n  with {backlog} more waiting behind one key: \
         {with_backlog} ({backlog_ratio:.2}x)"
    ));
    bench.reset().await?;
    Ok(OrderingReport {
        keys,
        insert_tasks_per_s: insert,
        drain_tasks_per_s: drain.rate,
        ratio_vs_unordered: ratio,
        hot_key_tasks: hot,
        hot_key_tasks_per_s: hot_drain.rate,
        hot_key_handed_on: hot_drain.counters.tasks_handed_on,
        ordered_run_on: drain.counters.tasks_run_on,
        hot_key_run_on: hot_drain.counters.tasks_run_on,
        key_backlog: backlog,
        claim_ms: claim,
        claim_with_backlog_ms: with_backlog,
        claim_backlog_ratio: backlog_ratio,
    })
}

/// Times the real claim statement (10 tasks, released again) many times.
async fn claim_times(bench: &Bench) -> Result<Latency, Failure> {
    let mut ms = Vec::with_capacity(CLAIM_SAMPLES);
    for _ in 0..CLAIM_SAMPLES + 10 {
        let (got, took) = outbox::bench_support::claim_and_release(&bench.pool, QUEUE, 10).await?;
        if got == 0 {
            return Err(Failure::runtime("the timed claim found nothing to claim"));
        }
        ms.push(took.as_secs_f64() * 1000.0);
    }
    // The first few warm the plan cache and the connection.
    Ok(Latency::of(ms.split_off(10)))
}
