//! The look a relay takes at its broker before it runs: a NATS stream or a
//! RabbitMQ exchange that does not exist is named at start (the CLI's
//! `run` exits 2), where before it showed only as publishes retried for
//! ever as an outage; a broker that cannot be asked is not a refusal.

use std::time::Duration;

use outbox::relay::{Preflight, Relay};
use outbox_tests::TestDb;
use outbox_tests::brokers::{self, Kind};

/// The relay from `url`, with `route`, asked about its broker.
async fn look(url: &str, route: Option<&str>) -> Result<(), Preflight> {
    let mut relay = Relay::from_url("looked", url).await.expect("a relay");
    if let Some(route) = route {
        relay = relay.route(route);
    }
    relay.preflight().await
}

/// `outbox-worker run` with `args`, which must exit by itself within a
/// minute (a worker that started instead would run until killed).
async fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let child = tokio::process::Command::new(crate::WORKER)
        .arg("run")
        .args(args)
        .env_remove("DATABASE_URL")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the worker refused to start rather than running")
        .expect("the worker's output")
}

#[tokio::test]
async fn a_nats_relay_whose_subjects_no_stream_takes_is_refused_at_start() {
    let Some(server) = brokers::start(Kind::Nats).await else {
        return;
    };
    let url = Kind::Nats.url(&server);
    let db = TestDb::migrated().await;

    // No stream at all: the CLI names the subjects and how to fix it.
    let relay = format!("orders={url}");
    let out = run_to_exit(&["--database-url", &db.url, "--relay", &relay], &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("relay \"orders\": no JetStream stream")
            && stderr.contains("\"outbox.event.>\"")
            && stderr.contains("stream=NAME"),
        "{stderr}"
    );
    match look(&url, None).await {
        Err(Preflight::Missing(why)) => assert!(why.contains("outbox.event.>"), "{why}"),
        other => panic!("no stream yet: {other:?}"),
    }
    // A relay that makes its stream is not refused for its absence.
    look(&format!("{url}?stream=MADE"), None)
        .await
        .expect("stream= makes it at the first publish");

    // A stream on one aggregate type's subject: some events can go, so
    // the relay runs (the route's check warns about the others).
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.expect("connect"));
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "ORDERS".to_owned(),
        subjects: vec!["outbox.event.order".to_owned()],
        ..Default::default()
    })
    .await
    .expect("a stream");
    look(&url, None)
        .await
        .expect("a stream takes some of the route's subjects");
    // Another route, which that stream does not take, is refused.
    match look(&url, Some("billing.{aggregate_type}")).await {
        Err(Preflight::Missing(why)) => assert!(why.contains("\"billing.>\""), "{why}"),
        other => panic!("no stream on billing.>: {other:?}"),
    }
    // A route whose fields begin its first token can go anywhere: any
    // stream may take its events.
    look(&url, Some("{aggregate_type}.events"))
        .await
        .expect("a route open from its first token");
    // Nothing was subscribed by the refused start.
    assert!(
        outbox::relay::subscriptions(&db.pool)
            .await
            .expect("subscriptions")
            .is_empty()
    );
}

#[tokio::test]
async fn a_nats_server_without_jetstream_is_refused_at_start() {
    let (name, candidates) = Kind::Nats.binary();
    let Some(binary) = brokers::find_binary(name, candidates) else {
        return;
    };
    let server =
        brokers::BrokerProcess::start("nats", &binary, &["-a", "127.0.0.1", "-p", "{port}"]).await;
    let url = Kind::Nats.url(&server);
    for url in [url.clone(), format!("{url}?stream=EVENTS")] {
        match look(&url, None).await {
            Err(Preflight::Missing(why)) => {
                assert!(why.contains("JetStream is not enabled"), "{why}");
            }
            other => panic!("{url}: a server without JetStream: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_broker_that_cannot_be_asked_is_not_a_refusal() {
    // A port nothing listens on: the relay would start and retry.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    match look(&format!("nats://127.0.0.1:{port}"), None).await {
        Err(Preflight::Unreachable(why)) => assert!(why.contains("not connected"), "{why}"),
        other => panic!("no NATS server: {other:?}"),
    }
    let sink = outbox::relay::rabbitmq::RabbitSink::new(
        &format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        "outbox",
    );
    let route = outbox::relay::Route::parse("outbox.event.{aggregate_type}").unwrap();
    match outbox::relay::Sink::preflight(&sink, &route).await {
        Err(Preflight::Unreachable(why)) => assert!(why.contains("RabbitMQ"), "{why}"),
        other => panic!("no RabbitMQ server: {other:?}"),
    }
}

#[tokio::test]
async fn a_rabbitmq_relay_without_its_exchange_is_refused_at_start() {
    use outbox::relay::Sink as _;
    let Some(server) = brokers::start(Kind::Rabbitmq).await else {
        return;
    };
    let uri = format!("amqp://guest:guest@127.0.0.1:{}/%2f", server.port);
    let route = outbox::relay::Route::parse("outbox.event.{aggregate_type}").unwrap();
    // A node that just opened its port may still refuse the handshake.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let missing = outbox::relay::rabbitmq::RabbitSink::new(&uri, "nowhere");
    let why = loop {
        match missing.preflight(&route).await {
            Err(Preflight::Missing(why)) => break why,
            Err(Preflight::Unreachable(why)) if tokio::time::Instant::now() < deadline => {
                eprintln!("{why}: trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("no exchange \"nowhere\": {other:?}\n{}", server.log()),
        }
    };
    assert!(
        why.contains("no exchange \"nowhere\"") && why.contains("exchange_type="),
        "{why}"
    );
    // Declared by the sink itself: nothing to find.
    let declaring = outbox::relay::rabbitmq::RabbitSink::new(&uri, "nowhere")
        .declare_exchange("topic")
        .unwrap();
    declaring
        .preflight(&route)
        .await
        .expect("declared at connect");
    // The CLI refuses it, naming the relay.
    let db = TestDb::migrated().await;
    let relay = format!("r={}?exchange=nowhere", Kind::Rabbitmq.url(&server));
    let out = run_to_exit(
        &["--database-url", &db.url, "--relay", &relay],
        &[("OUTBOX_RELAY_R_SECRET", "guest")],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("relay \"r\": RabbitMQ has no exchange"),
        "{stderr}"
    );
}
