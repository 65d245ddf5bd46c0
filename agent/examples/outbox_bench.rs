//! How fast the durable outbox takes events (each append is one SQLite
//! transaction, WAL, synchronous=FULL) and reads them back, and how fast
//! the webhook sink then delivers them all to a receiver on 127.0.0.1
//! (default batches of 100; each acknowledged batch moves the cursor).
//!
//! `cargo run --release -p memwatch --example outbox_bench -- [EVENTS] [DIR]`
//! (DIR defaults to a temporary directory under $TMPDIR).

use std::time::{Duration, Instant};

use memwatch::{
    EventBody, EventKind, Metrics, Outbox, OutboxLimits as Limits, WebhookConfig, WebhookSink,
};
use memwatch_test_support::webhook::Receiver;

fn main() {
    let mut args = std::env::args().skip(1);
    let events: u64 = args.next().map_or(10_000, |n| n.parse().expect("EVENTS"));
    let tmp = tempfile::tempdir_in(
        args.next()
            .unwrap_or_else(|| std::env::temp_dir().display().to_string()),
    )
    .expect("temp dir");
    let metrics = Metrics::new(&prometheus::Registry::new()).unwrap();
    let outbox = Outbox::open(tmp.path(), "bench", Limits::default(), metrics.clone()).unwrap();

    let start = Instant::now();
    for i in 0..events {
        let mut body = EventBody::new(EventKind::OomKill);
        body.pid = Some(i as u32);
        body.comm = Some("memhog".into());
        body.cgroup = Some("/sys/fs/cgroup/memory/slurm/uid_1000/job_12345".into());
        body.rss_bytes = Some(64 << 20);
        outbox.append(body, None);
    }
    let append = start.elapsed();

    let start = Instant::now();
    let mut after = 0;
    let mut read = 0;
    loop {
        let page = outbox.read(after, 1000);
        let Some(last) = page.last() else { break };
        after = last.seq;
        read += page.len();
    }
    let reading = start.elapsed();
    assert_eq!(read as u64, events);
    let size = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum::<u64>();
    println!(
        "append: {events} events in {:.2} s = {:.0} events/s ({:.1} µs each)",
        append.as_secs_f64(),
        events as f64 / append.as_secs_f64(),
        append.as_secs_f64() * 1e6 / events as f64
    );
    println!(
        "read:   {read} events in pages of 1000 in {:.3} s = {:.0} events/s",
        reading.as_secs_f64(),
        read as f64 / reading.as_secs_f64()
    );
    println!("state dir size: {:.1} MiB", size as f64 / (1 << 20) as f64);

    let (delivered, took) = deliver_to_local_webhook(outbox, metrics, events);
    println!(
        "deliver: {delivered} events to a webhook on 127.0.0.1 in {:.2} s = {:.0} events/s",
        took.as_secs_f64(),
        delivered as f64 / took.as_secs_f64()
    );
}

/// Runs the webhook sink over the outbox until a local receiver has counted
/// `events` events (bounded: two minutes), and returns the count and time.
fn deliver_to_local_webhook(outbox: Outbox, metrics: Metrics, events: u64) -> (u64, Duration) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async move {
        let receiver = Receiver::start();
        let sink = WebhookSink::new(WebhookConfig::from_flag(0, &receiver.url()).unwrap()).unwrap();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let start = Instant::now();
        let delivering = tokio::spawn(memwatch::deliver(sink, outbox, metrics, shutdown));
        let deadline = start + Duration::from_secs(120);
        while (receiver.event_count() as u64) < events && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let took = start.elapsed();
        let _ = stop.send(true);
        let _ = delivering.await;
        (receiver.event_count() as u64, took)
    })
}
