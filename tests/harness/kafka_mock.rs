//! A Kafka cluster for the relay tests: librdkafka's mock cluster (the
//! Kafka protocol on loopback ports, the logs in memory), in a process of
//! its own that lives as long as its standard input is open.
//!
//! Usage: `outbox-kafka-mock [BROKERS]` (default 3). It prints its
//! bootstrap servers on the first line of standard output, then reads one
//! command a line and answers `ok` (or `error: ...`):
//! - `topic NAME PARTITIONS`: creates a topic (replicated on every broker);
//! - `down`: every broker drops its connections and refuses new ones
//!   (its log is kept, as a broker's disk would be);
//! - `up`: every broker accepts connections again.

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;

use rdkafka::mocking::MockCluster;

fn main() -> ExitCode {
    let brokers: i32 = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 3,
        Some(Ok(n)) if (1..=16).contains(&n) => n,
        Some(_) => {
            eprintln!("usage: outbox-kafka-mock [BROKERS (1 to 16)]");
            return ExitCode::from(2);
        }
    };
    let cluster = match MockCluster::new(brokers) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start the mock cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{}", cluster.bootstrap_servers())
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let result = match words.as_slice() {
            [] => continue,
            ["topic", name, partitions] => match partitions.parse() {
                Ok(n) => cluster
                    .create_topic(name, n, brokers)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("partitions: {e}")),
            },
            // -1: every broker.
            ["down"] => cluster.broker_down(-1).map_err(|e| e.to_string()),
            ["up"] => cluster.broker_up(-1).map_err(|e| e.to_string()),
            _ => Err(format!("unknown command {line:?}")),
        };
        let answer = match result {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("error: {e}"),
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    // Standard input closed: the test is done (or gone), and the cluster
    // goes with this process.
    ExitCode::SUCCESS
}
