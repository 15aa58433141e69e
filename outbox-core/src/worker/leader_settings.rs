//! The settings only the maintenance leader applies: recovery's timeout,
//! the retentions, cleanup and vacuum. Every worker accepts them, but one
//! that does not lead changes nothing with them until it leads. So the
//! leader records its own beside its lease (migration 51), and a worker
//! that does not lead compares and warns once per leader, naming what
//! differs: an operator who gave one worker `--heartbeat-timeout 30s` learns
//! that the leader's five minutes apply.

use std::time::Duration;

use serde_json::{Map, Value};

use super::config::WorkerConfig;

/// The leader-applied settings of `config`, as JSON: each under its
/// `WorkerConfig` name, written as an operator writes it (`5m`, `none`).
pub(crate) fn of(config: &WorkerConfig) -> Value {
    let time = |d: Duration| Value::String(whole_unit(d));
    let mut m = Map::new();
    // Not maintenance_interval: a follower's campaigns for the lease at
    // its own, which is its to choose.
    m.insert("heartbeat_timeout".into(), time(config.heartbeat_timeout));
    m.insert("retention".into(), time(config.retention));
    m.insert("history_partition".into(), time(config.history_partition));
    m.insert("event_log_max_age".into(), time(config.event_log_max_age));
    m.insert(
        "dead_retention".into(),
        config
            .dead_retention
            .map_or_else(|| Value::String("none".into()), time),
    );
    m.insert(
        "vacuum_threshold".into(),
        Value::String(config.vacuum_threshold.to_string()),
    );
    m.insert("cleanup_interval".into(), time(config.cleanup_interval));
    m.insert(
        "forget_workers_after".into(),
        time(config.forget_workers_after),
    );
    m.insert(
        "snapshot_age_warning".into(),
        time(config.snapshot_age_warning),
    );
    Value::Object(m)
}

/// The settings whose values differ between this worker's (`own`) and the
/// leader's, as `name: X here, Y on the leader`, by name. A setting the
/// leader did not record (an older build) is not compared.
pub(crate) fn differences(own: &Value, leader: &Value) -> Vec<String> {
    let (Some(own), Some(leader)) = (own.as_object(), leader.as_object()) else {
        return Vec::new();
    };
    let mut out: Vec<String> = own
        .iter()
        .filter_map(|(name, here)| {
            let there = leader.get(name)?;
            (there != here).then(|| {
                format!(
                    "{name}: {} here, {} on the leader",
                    shown(here),
                    shown(there)
                )
            })
        })
        .collect();
    out.sort();
    out
}

/// `d` in the largest unit that holds it whole: `5m`, `7d`, `1500ms`.
fn whole_unit(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

fn shown(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_settings_that_differ_are_named_with_both_values() {
        let own = of(&WorkerConfig {
            heartbeat_timeout: Duration::from_secs(30),
            dead_retention: Some(Duration::from_secs(7200)),
            ..WorkerConfig::default()
        });
        let mut leader = of(&WorkerConfig::default());
        assert_eq!(
            differences(&own, &leader),
            [
                "dead_retention: 2h here, none on the leader",
                "heartbeat_timeout: 30s here, 5m on the leader",
            ]
        );
        assert!(differences(&leader, &leader).is_empty());
        // A leader of an older build that records fewer settings, or none.
        leader.as_object_mut().unwrap().remove("dead_retention");
        assert_eq!(differences(&own, &leader).len(), 1);
        assert!(differences(&own, &Value::Null).is_empty());
    }

    #[test]
    fn durations_are_written_in_their_largest_whole_unit() {
        let ms = Duration::from_millis;
        assert_eq!(whole_unit(ms(300_000)), "5m");
        assert_eq!(whole_unit(ms(604_800_000)), "7d");
        assert_eq!(whole_unit(ms(90_000)), "90s");
        assert_eq!(whole_unit(ms(1_500)), "1500ms");
        assert_eq!(whole_unit(ms(0)), "0s");
    }
}
