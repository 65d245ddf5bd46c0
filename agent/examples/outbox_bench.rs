//! How fast the durable outbox stores events (appends queue; the writer
//! thread commits what waits in one SQLite transaction, WAL,
//! synchronous=FULL): one at a time (each waited for until durable, the
//! latency of a lone OOM kill) and as a burst (group commit), side by
//! side; how fast it reads them back, and how fast
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

    // One at a time: each event waited for until it is durable.
    let lone = (events / 10).clamp(100, 1000);
    let mut took = Vec::new();
    let mut newest = outbox.subscribe();
    for i in 0..lone {
        let start = Instant::now();
        let seq = outbox.append(oom_kill(i), None).seq;
        while *newest.borrow_and_update() < seq {
            std::hint::spin_loop();
        }
        took.push(start.elapsed());
    }
    took.sort();
    let lone_total: Duration = took.iter().sum();
    // The same, written on the caller's thread (what an append cost when
    // it wrote its event itself): the hand-off's share of the latency.
    let mut inline = Vec::new();
    for i in 0..lone {
        let start = Instant::now();
        outbox.append(oom_kill(i), None);
        outbox.maintain();
        inline.push(start.elapsed());
    }
    inline.sort();

    // A burst: appended as fast as they come, then waited for.
    let start = Instant::now();
    let mut last = 0;
    for i in 0..events {
        last = outbox.append(oom_kill(i), None).seq;
    }
    let queued = start.elapsed();
    while *newest.borrow_and_update() < last {
        std::thread::sleep(Duration::from_micros(50));
    }
    let append = start.elapsed();
    let events = events + 2 * lone;

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
    assert_eq!(read as u64, events, "{:?}", outbox.status());
    let size = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum::<u64>();
    let burst = events - 2 * lone;
    println!(
        "one at a time: {lone} events, each durable after p50 {:.0} µs, p99 {:.0} µs = {:.0} events/s",
        took[took.len() / 2].as_secs_f64() * 1e6,
        took[took.len() * 99 / 100].as_secs_f64() * 1e6,
        lone as f64 / lone_total.as_secs_f64()
    );
    println!(
        "written by the caller instead: p50 {:.0} µs, p99 {:.0} µs",
        inline[inline.len() / 2].as_secs_f64() * 1e6,
        inline[inline.len() * 99 / 100].as_secs_f64() * 1e6,
    );
    println!(
        "burst: {burst} events queued in {:.3} s, all durable after {:.2} s = {:.0} events/s \
         ({:.1}x the one-at-a-time rate)",
        queued.as_secs_f64(),
        append.as_secs_f64(),
        burst as f64 / append.as_secs_f64(),
        (burst as f64 / append.as_secs_f64()) / (lone as f64 / lone_total.as_secs_f64())
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

fn oom_kill(i: u64) -> EventBody {
    let mut body = EventBody::new(EventKind::OomKill);
    body.pid = Some(i as u32);
    body.comm = Some("memhog".into());
    body.cgroup = Some("/sys/fs/cgroup/memory/slurm/uid_1000/job_12345".into());
    body.rss_bytes = Some(64 << 20);
    body
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
