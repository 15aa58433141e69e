//! Redis Streams sink (`redis` feature), with the `redis` crate.
//!
//! Each event is added to its routed stream by one script that first
//! checks a dedup key for the stream and the event id
//! (`outbox:dedup:<stream>:<event id>`), then runs XADD, then sets the
//! dedup key with a time to live: a republished event is not added twice
//! to a stream within that time; a key of the event id alone made a second
//! subscription adding the event to another stream of the same Redis skip
//! it as a repeat. (The dedup key is set after the XADD, not before: Redis
//! does not undo a script's writes when a later command fails, so setting
//! it first would mark an event that never reached the stream as done.)
//!
//! Redis acknowledges a write before it is on disk unless it runs with
//! `appendonly yes` and `appendfsync always`; with less, a crash of Redis
//! can lose events the relay already completed.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::Mutex;

use super::sink::{Message, PublishError, PublishFuture, Sink};

const SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local args = {'XADD', KEYS[1]}
if tonumber(ARGV[2]) > 0 then
  table.insert(args, 'MAXLEN'); table.insert(args, '~'); table.insert(args, ARGV[2])
end
table.insert(args, '*')
for i = 3, #ARGV do table.insert(args, ARGV[i]) end
redis.call(unpack(args))
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
return 1
";

/// A Redis Streams sink.
pub struct RedisSink {
    client: redis::Client,
    connection: Mutex<Option<MultiplexedConnection>>,
    script: redis::Script,
    dedup_ttl: Duration,
    maxlen: u64,
    dedup_prefix: String,
}

impl RedisSink {
    /// A sink on `url` (`redis://host:port/db`); connects on first use.
    pub fn new(url: &str, dedup_ttl: Duration, maxlen: u64) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("Redis URL: {e}"))?;
        Ok(Self {
            client,
            connection: Mutex::new(None),
            script: redis::Script::new(SCRIPT),
            dedup_ttl,
            maxlen,
            dedup_prefix: "outbox:dedup:".to_owned(),
        })
    }

    async fn connection(&self) -> Result<MultiplexedConnection, PublishError> {
        let mut held = self.connection.lock().await;
        if let Some(c) = held.as_ref() {
            return Ok(c.clone());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| PublishError::transient("connect", e))?;
        *held = Some(c.clone());
        Ok(c)
    }

    async fn publish_one(&self, message: &Message) -> Result<(), PublishError> {
        // Also here: a wrapper (Relay::wrap_sink) may not forward `check`.
        refuse_payload_header(message)?;
        let mut conn = self.connection().await?;
        let mut call = self.script.prepare_invoke();
        call.key(&message.destination)
            .key(format!(
                "{}{}:{}",
                self.dedup_prefix, message.destination, message.event_id
            ))
            .arg(self.dedup_ttl.as_secs().max(1))
            .arg(self.maxlen);
        for (name, value) in &message.headers {
            call.arg(name).arg(value);
        }
        call.arg("payload").arg(&message.payload[..]);
        match call.invoke_async::<i64>(&mut conn).await {
            // 0: added before, within the dedup time: done all the same.
            Ok(_) => Ok(()),
            Err(e) => {
                let error = classify(&e);
                if matches!(
                    error,
                    PublishError::Transient {
                        kind: "connection",
                        ..
                    }
                ) {
                    *self.connection.lock().await = None;
                }
                Err(error)
            }
        }
    }
}

/// Refuses for good (its aggregate parks) an event with a header named
/// `payload`: the entry's fields are the headers and then `payload`, so
/// the entry would carry two `payload` fields, and which one a consumer
/// reads would depend on its client.
fn refuse_payload_header(message: &Message) -> Result<(), PublishError> {
    match message.headers.iter().find(|(name, _)| name == "payload") {
        Some(_) => Err(PublishError::permanent(
            "payload_header",
            "header \"payload\" would be a second payload field of the stream entry; rename it",
        )),
        None => Ok(()),
    }
}

/// Server error codes that are the moment, not the message: out of
/// memory, a busy script, loading, a replica or a cluster in the way, a
/// script the server forgot.
const TRANSIENT_CODES: [&str; 10] = [
    "OOM",
    "BUSY",
    "LOADING",
    "NOREPLICAS",
    "MISCONF",
    "READONLY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "NOSCRIPT",
];

fn classify(e: &redis::RedisError) -> PublishError {
    use redis::ErrorKind;
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return PublishError::transient("connection", e);
    }
    if matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig
    ) {
        return PublishError::transient("auth", e);
    }
    // The client's known kinds have their codes too (LOADING, READONLY...).
    match e.code().map(|code| script_error_code(code, e.detail())) {
        Some(code) if TRANSIENT_CODES.contains(&code) => PublishError::transient("unavailable", e),
        Some("WRONGTYPE") => PublishError::permanent("wrong_type", e),
        Some(_) => PublishError::permanent("rejected", e),
        None => PublishError::transient("other", e),
    }
}

/// The code of the error behind a failed script. Redis 7 answers a script
/// whose command failed with that command's code (`OOM ...`). Redis 6
/// answers `ERR Error running script (call to f_<sha>): @user_script:N:
/// <the command's error>`, where the inner error's code may carry its `-`
/// (`-OOM command not allowed ...`): read as `ERR`, an out-of-memory
/// moment would park every aggregate it touched. Any other error is
/// returned as it came.
fn script_error_code<'a>(code: &'a str, detail: Option<&'a str>) -> &'a str {
    let Some(detail) = detail.filter(|d| code == "ERR" && d.starts_with("Error running script"))
    else {
        return code;
    };
    detail
        .split(|c: char| c.is_whitespace() || c == ':')
        .map(|word| word.trim_start_matches('-'))
        .find_map(|word| {
            TRANSIENT_CODES
                .into_iter()
                .chain(["WRONGTYPE"])
                .find(|inner| *inner == word)
        })
        .unwrap_or(code)
}

impl Sink for RedisSink {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn publish<'a>(&'a self, message: &'a Message) -> PublishFuture<'a> {
        Box::pin(self.publish_one(message))
    }

    fn check(&self, message: &Message) -> Result<(), PublishError> {
        refuse_payload_header(message)
    }
}

/// Builds the sink for a `redis://` URL: `dedup_ttl_s` (default 86400),
/// `maxlen` (approximate stream cap; default 0, none). A password belongs
/// in `OUTBOX_RELAY_<NAME>_SECRET`, not in the URL.
pub(crate) fn from_url(
    url: &::url::Url,
    params: &mut super::url::Params,
    name: &str,
) -> Result<Arc<dyn Sink>, String> {
    let ttl = params.parse_range("dedup_ttl_s", 86_400, 1, 86_400 * 30)?;
    let maxlen = params.parse_range("maxlen", 0, 0, u64::from(u32::MAX))?;
    let server = super::url::with_secret_password(url, params, name, "Redis")?;
    Ok(Arc::new(RedisSink::new(
        server.as_str(),
        Duration::from_secs(ttl),
        maxlen,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reply as the client reads it.
    fn server_error(reply: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{reply:?} read as {other:?}"),
        }
    }

    #[test]
    fn a_redis_6_script_error_is_classified_by_the_command_error_inside_it() {
        let script = "ERR Error running script (call to f_6b1bf486c81ceb7edf3c093f4c48582e38c0e791): @user_script:9: @user_script: 9:";
        for (inner, transient, kind) in [
            (
                "-OOM command not allowed when used memory > 'maxmemory'.",
                true,
                "unavailable",
            ),
            (
                "-NOREPLICAS Not enough good replicas to write.",
                true,
                "unavailable",
            ),
            (
                "-READONLY You can't write against a read only replica.",
                true,
                "unavailable",
            ),
            (
                "-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist on disk.",
                true,
                "unavailable",
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                false,
                "wrong_type",
            ),
            (
                "Wrong number of args calling Redis command From Lua script",
                false,
                "rejected",
            ),
        ] {
            let e = classify(&server_error(&format!("{script} {inner}")));
            assert_eq!((e.is_transient(), e.kind()), (transient, kind), "{inner}");
        }
    }

    #[test]
    fn a_header_named_payload_is_refused_for_good() {
        let refused =
            refuse_payload_header(&Message::for_test("s", &[("a", "1"), ("payload", "x")]))
                .expect_err("a second payload field");
        assert_eq!(
            (refused.is_transient(), refused.kind()),
            (false, "payload_header")
        );
        assert!(refuse_payload_header(&Message::for_test("s", &[("Payload", "x")])).is_ok());
    }

    #[test]
    fn redis_7_codes_are_read_as_they_come() {
        for (reply, transient, kind) in [
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: f_1, on @user_script:9.",
                true,
                "unavailable",
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                false,
                "wrong_type",
            ),
            (
                "ERR The ID specified in XADD is equal or smaller than the target stream top item",
                false,
                "rejected",
            ),
            (
                "READONLY You can't write against a read only replica.",
                true,
                "unavailable",
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                true,
                "unavailable",
            ),
            (
                "NOSCRIPT No matching script. Please use EVAL.",
                true,
                "unavailable",
            ),
            // An ERR that only mentions a code is not that code.
            ("ERR unknown command 'OOM'", false, "rejected"),
        ] {
            let e = classify(&server_error(reply));
            assert_eq!((e.is_transient(), e.kind()), (transient, kind), "{reply}");
        }
    }
}
