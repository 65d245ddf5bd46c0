//! The action protocol against a fake scheduler: each step on its own, then
//! a model test with several agents on one fake cluster, random health
//! changes, call delays and refusals, on a paused clock.

use std::{cell::RefCell, collections::BTreeMap, rc::Rc, time::Duration};

use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::sinks::guard::{Capacity, Guard};

/// One cluster every fake agent shares: who took which member.
#[derive(Debug, Default)]
struct Cluster {
    /// Members by name; `true`: taken by memwatch.
    taken: BTreeMap<String, bool>,
    /// Members out for other reasons (never memwatch's).
    others_leaving: usize,
    /// `(when, members left)` at every change.
    history: Vec<(Instant, usize)>,
}

impl Cluster {
    fn new(members: usize, others_leaving: usize) -> Self {
        Self {
            taken: (0..members).map(|i| (format!("m{i}"), false)).collect(),
            others_leaving,
            history: Vec::new(),
        }
    }

    fn capacity(&self) -> Capacity {
        let leaving = self.taken.values().filter(|t| **t).count() + self.others_leaving;
        Capacity {
            listed: self.taken.len(),
            leaving,
            running: self.taken.len() - leaving,
        }
    }

    fn set(&mut self, member: &str, taken: bool) {
        self.taken.insert(member.to_string(), taken);
        let c = self.capacity();
        self.history.push((Instant::now(), c.listed - c.leaving));
    }

    fn keeper(&self) -> Option<String> {
        self.taken.iter().find(|(_, t)| **t).map(|(m, _)| m.clone())
    }
}

/// What a fake agent saw and said.
#[derive(Debug, Default)]
struct Log {
    /// (kind, reason) of every report.
    reports: Vec<(EventKind, String)>,
    /// The reports, the acts that landed (`None`) and the episodes' starts
    /// (the model's `WorkerRecovered` marks), in order.
    timeline: Vec<Option<(EventKind, String)>>,
    /// Acts that landed, and whether the worker was unhealthy when the
    /// protocol decided to act.
    acts: Vec<bool>,
    reads: usize,
}

/// One agent's view of the shared cluster.
struct Fake {
    cluster: Rc<RefCell<Cluster>>,
    member: String,
    /// `(from, unhealthy)`: the worker's health over time.
    health: Vec<(Instant, bool)>,
    /// Call delays and refusals, from a seed.
    rng: u64,
    max_delay: Duration,
    /// Every call takes this long, when set (instead of a random delay).
    fixed_delay: Option<Duration>,
    refuse_percent: u64,
    log: Rc<RefCell<Log>>,
}

impl Fake {
    fn unhealthy(&self) -> bool {
        let now = Instant::now();
        self.health
            .iter()
            .rev()
            .find(|(from, _)| *from <= now)
            .is_some_and(|(_, u)| *u)
    }

    fn next(&mut self) -> u64 {
        // xorshift64: a fixed sequence per seed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    async fn delay(&mut self) {
        if let Some(fixed) = self.fixed_delay {
            tokio::time::sleep(fixed).await;
            return;
        }
        let max = self.max_delay.as_millis() as u64;
        if max > 0 {
            let ms = self.next() % (max + 1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    fn plan(&self) -> Read {
        let cluster = self.cluster.borrow();
        if cluster.taken[&self.member] {
            return Read::Done(format!("{} taken", self.member));
        }
        Read::Act(Plan {
            subject: format!("member {}", self.member),
            members: vec![self.member.clone()],
            taking: 1,
            running: 1,
            capacity: cluster.capacity(),
        })
    }
}

impl Scheduler for Fake {
    type Error = std::convert::Infallible;

    fn sink(&self) -> &str {
        "fake"
    }

    fn words(&self) -> Words {
        Words {
            doing: "taking",
            done: "taken",
            noun: "take",
            undone: "given back",
        }
    }

    fn subject(&self, _worker: &str) -> String {
        format!("member {}", self.member)
    }

    fn stale(&self, worker: &str) -> Option<String> {
        (!self.unhealthy()).then(|| format!("worker {worker} is healthy now"))
    }

    async fn read(&mut self, _worker: &str) -> Result<Read, Self::Error> {
        self.delay().await;
        self.log.borrow_mut().reads += 1;
        Ok(self.plan())
    }

    async fn act(
        &mut self,
        _w: &str,
        plan: &Plan,
        _why: Option<&str>,
    ) -> Result<Acted, Self::Error> {
        let decided_unhealthy = self.unhealthy();
        self.delay().await;
        if self.next() % 100 < self.refuse_percent {
            return Ok(Acted::Refused("the scheduler said no".into()));
        }
        self.cluster.borrow_mut().set(plan.scheduler_worker(), true);
        let mut log = self.log.borrow_mut();
        log.acts.push(decided_unhealthy);
        log.timeline.push(None);
        Ok(Acted::Done)
    }

    async fn undo(&mut self, _w: &str, plan: &Plan) -> Result<bool, Self::Error> {
        self.delay().await;
        self.cluster
            .borrow_mut()
            .set(plan.scheduler_worker(), false);
        Ok(true)
    }

    async fn recheck(&mut self, _plan: &Plan) -> Result<(Capacity, Option<String>), Self::Error> {
        self.delay().await;
        let cluster = self.cluster.borrow();
        Ok((cluster.capacity(), cluster.keeper()))
    }

    fn report(&self, kind: EventKind, _w: &str, _s: Option<&str>, reason: String) {
        let mut log = self.log.borrow_mut();
        log.timeline.push(Some((kind, reason.clone())));
        log.reports.push((kind, reason));
    }

    fn count(&self, _action: &str) {}
}

fn guard(min_remaining: usize, fraction: f64) -> Guard {
    Guard {
        min_remaining,
        min_remaining_fraction: fraction,
    }
}

/// A fake agent on `cluster` owning `member`, unhealthy from the start
/// (the clock is paused: `Instant::now()` is the test's start).
fn agent(cluster: &Rc<RefCell<Cluster>>, member: &str) -> Fake {
    Fake {
        cluster: Rc::clone(cluster),
        member: member.into(),
        health: vec![(Instant::now(), true)],
        rng: 0x9e37_79b9_7f4a_7c15,
        max_delay: Duration::ZERO,
        fixed_delay: None,
        refuse_percent: 0,
        log: Rc::default(),
    }
}

fn kinds(fake: &Fake) -> Vec<EventKind> {
    fake.log.borrow().reports.iter().map(|(k, _)| *k).collect()
}

#[tokio::test(start_paused = true)]
async fn acts_once_and_adopts_what_is_done() {
    let cluster = Rc::new(RefCell::new(Cluster::new(4, 0)));
    let mut fake = agent(&cluster, "m0");
    let mut actions = Actions::new(guard(1, 0.5), Duration::from_secs(1));
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    assert!(cluster.borrow().taken["m0"]);
    assert!(actions.is_done("w") && !actions.has_pending());
    // Wanted again in the same episode: nothing asked.
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    assert_eq!(fake.log.borrow().acts.len(), 1);
    // A new episode finds it taken already: adopted, not acted on again.
    actions.forget("w");
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    assert_eq!(fake.log.borrow().acts.len(), 1);
    assert!(actions.is_done("w"));
    assert!(kinds(&fake).is_empty(), "{:?}", fake.log.borrow().reports);
}

#[tokio::test(start_paused = true)]
async fn a_stale_worker_is_skipped_without_asking_the_scheduler() {
    let cluster = Rc::new(RefCell::new(Cluster::new(4, 0)));
    let mut fake = agent(&cluster, "m0");
    fake.health = vec![(Instant::now(), false)];
    let mut actions = Actions::new(guard(1, 0.5), Duration::ZERO);
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    assert_eq!(kinds(&fake), [EventKind::ActionSkipped]);
    assert_eq!(fake.log.borrow().reads, 0);
    assert!(!actions.has_pending(), "dropped: the present says healthy");
}

#[tokio::test(start_paused = true)]
async fn the_gate_holds_without_asking_and_says_so_once() {
    let cluster = Rc::new(RefCell::new(Cluster::new(4, 0)));
    let mut fake = agent(&cluster, "m0");
    let mut actions = Actions::new(guard(1, 0.5), Duration::ZERO);
    actions.set_gate(ActionGate::closed_for(
        Duration::from_secs(30),
        "lost".into(),
    ));
    actions.want("w", None);
    for _ in 0..3 {
        actions.run(&mut fake).await.unwrap();
    }
    assert_eq!(kinds(&fake), [EventKind::ActionSkipped]);
    let reason = fake.log.borrow().reports[0].1.clone();
    assert!(
        reason.starts_with("member m0 not taken yet: no scheduler action within 30s"),
        "{reason}"
    );
    assert_eq!(fake.log.borrow().reads, 0);
    tokio::time::advance(Duration::from_secs(31)).await;
    actions.run(&mut fake).await.unwrap();
    assert!(cluster.borrow().taken["m0"], "taken once the window passed");
}

#[tokio::test(start_paused = true)]
async fn the_guard_and_the_scheduler_refuse_each_said_once_until_it_goes() {
    let cluster = Rc::new(RefCell::new(Cluster::new(2, 1)));
    let mut fake = agent(&cluster, "m0");
    let mut actions = Actions::new(guard(1, 0.0), Duration::ZERO);
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    actions.run(&mut fake).await.unwrap();
    assert_eq!(kinds(&fake), [EventKind::GuardBlocked]);
    let reason = fake.log.borrow().reports[0].1.clone();
    assert!(
        reason.starts_with("not taking member m0: cluster guard: taking 1 would leave 0 of 2"),
        "{reason}"
    );
    assert!(actions.is_pending("w"), "tried again later");
    // The other member is back; the scheduler now refuses, twice.
    cluster.borrow_mut().others_leaving = 0;
    fake.refuse_percent = 100;
    actions.forget("w");
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    actions.run(&mut fake).await.unwrap();
    assert_eq!(
        kinds(&fake),
        [EventKind::GuardBlocked, EventKind::ActionRefused]
    );
    fake.refuse_percent = 0;
    actions.run(&mut fake).await.unwrap();
    assert!(cluster.borrow().taken["m0"] && actions.is_done("w"));
}

#[tokio::test(start_paused = true)]
async fn a_recovery_while_the_action_was_in_flight_undoes_it() {
    let cluster = Rc::new(RefCell::new(Cluster::new(4, 0)));
    let mut fake = agent(&cluster, "m0");
    // Read at 100 ms (unhealthy), healthy from 150 ms, the act lands at 200.
    fake.fixed_delay = Some(Duration::from_millis(100));
    let start = Instant::now();
    fake.health = vec![(start, true), (start + Duration::from_millis(150), false)];
    let mut actions = Actions::new(guard(1, 0.5), Duration::from_secs(1));
    actions.want("w", None);
    actions.run(&mut fake).await.unwrap();
    assert_eq!(
        fake.log.borrow().acts,
        [true],
        "acted: unhealthy when decided"
    );
    assert!(!cluster.borrow().taken["m0"], "given back");
    assert_eq!(kinds(&fake), [EventKind::ActionSkipped]);
    let reason = fake.log.borrow().reports[0].1.clone();
    assert!(
        reason.contains(
            "is healthy now; member m0 given back: it recovered while the take was in flight"
        ),
        "{reason}"
    );
    assert!(!actions.has_pending() && !actions.is_done("w"));
}

#[tokio::test(start_paused = true)]
async fn actions_that_crossed_the_floor_together_leave_only_the_lowest_name() {
    // Three members, one may go (min_remaining 2): m1 and m2 read the same
    // untouched cluster, both take; after the settle, m1 keeps its take
    // (the lowest name), m2 gives its back and says so once.
    let cluster = Rc::new(RefCell::new(Cluster::new(3, 0)));
    let g = guard(2, 0.0);
    let mut a = agent(&cluster, "m1");
    let mut b = agent(&cluster, "m2");
    a.fixed_delay = Some(Duration::from_millis(100));
    b.fixed_delay = Some(Duration::from_millis(100));
    let mut actions_a = Actions::new(g, Duration::from_secs(2));
    let mut actions_b = Actions::new(g, Duration::from_secs(2));
    actions_a.want("wa", None);
    actions_b.want("wb", None);
    let (ra, rb) = tokio::join!(actions_a.run(&mut a), actions_b.run(&mut b));
    ra.unwrap();
    rb.unwrap();
    let taken = cluster.borrow().taken.clone();
    assert!(taken["m1"] && !taken["m2"], "{taken:?}");
    assert!(kinds(&a).is_empty());
    assert_eq!(kinds(&b), [EventKind::GuardBlocked]);
    let reason = b.log.borrow().reports[0].1.clone();
    assert!(
        reason.contains("m1 keeps its take (the lowest name)"),
        "{reason}"
    );
    assert!(actions_b.is_pending("wb"), "tried again later");
    // Tried again: the guard now refuses m2, said once already.
    actions_b.run(&mut b).await.unwrap();
    assert_eq!(kinds(&b), [EventKind::GuardBlocked]);
    assert!(!cluster.borrow().taken["m2"]);
}

/// One model run: see [`model`].
#[derive(Clone, Debug)]
struct Case {
    /// Per agent: the times (ms) its worker's health flips, from healthy.
    flips: Vec<Vec<u64>>,
    extra_members: usize,
    others_leaving: usize,
    min_remaining: usize,
    fraction: f64,
    max_delay_ms: u64,
    refuse_percent: u64,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (2usize..=5)
        .prop_flat_map(|agents| {
            (
                // Whole seconds: several workers often turn together.
                prop::collection::vec(
                    prop::collection::vec((0u64..20).prop_map(|s| s * 1000), 0..5),
                    agents,
                ),
                0usize..3,
                0usize..2,
                1usize..3,
                prop_oneof![Just(0.0), Just(0.5), 0.0f64..0.8],
                0u64..=400,
                prop_oneof![Just(0u64), Just(20), Just(50)],
                1u64..u64::MAX,
            )
        })
        .prop_map(
            |(
                flips,
                extra_members,
                others_leaving,
                min_remaining,
                fraction,
                max_delay_ms,
                refuse_percent,
                seed,
            )| Case {
                flips: flips
                    .into_iter()
                    .map(|mut f| {
                        f.sort_unstable();
                        f.dedup();
                        f
                    })
                    .collect(),
                extra_members,
                others_leaving,
                min_remaining,
                fraction,
                max_delay_ms,
                refuse_percent,
                seed,
            },
        )
}

const SETTLE: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(700);
const RUN: Duration = Duration::from_secs(30);

/// Several agents on one cluster, each its own member, health flipping at
/// random moments, every scheduler call delayed at random (0 to
/// `max_delay`) and some refused. Each agent runs what a sink runs: the
/// protocol at every tick (a heartbeat), its worker's recovery giving its
/// member back (the sink's resume).
async fn model(case: Case) -> Result<(), TestCaseError> {
    let agents = case.flips.len();
    let cluster = Rc::new(RefCell::new(Cluster::new(
        agents + case.extra_members,
        case.others_leaving,
    )));
    let g = guard(case.min_remaining, case.fraction);
    let start = Instant::now();
    let mut fakes = Vec::new();
    for (i, flips) in case.flips.iter().enumerate() {
        let mut health = vec![(start, false)];
        for (n, at) in flips.iter().enumerate() {
            health.push((start + Duration::from_millis(*at), n % 2 == 0));
        }
        fakes.push(Fake {
            cluster: Rc::clone(&cluster),
            member: format!("m{i}"),
            health,
            rng: case.seed.wrapping_add(i as u64 * 7919) | 1,
            max_delay: Duration::from_millis(case.max_delay_ms),
            fixed_delay: None,
            refuse_percent: case.refuse_percent,
            log: Rc::default(),
        });
    }
    let logs: Vec<_> = fakes.iter().map(|f| Rc::clone(&f.log)).collect();
    let runs = fakes.into_iter().map(|mut fake| async move {
        let mut actions = Actions::new(g, SETTLE);
        let mut was = false;
        while Instant::now() < start + RUN {
            let now = fake.unhealthy();
            if now != was {
                actions.forget("w");
                // A new episode: what was said may be said again.
                fake.log
                    .borrow_mut()
                    .timeline
                    .push(Some((EventKind::WorkerRecovered, "episode".into())));
                if !now && fake.cluster.borrow().taken[&fake.member] {
                    // The sink's resume on worker_recovered.
                    let plan = Plan {
                        subject: String::new(),
                        members: vec![fake.member.clone()],
                        taking: 1,
                        running: 1,
                        capacity: Capacity::default(),
                    };
                    fake.undo("w", &plan).await.unwrap();
                }
                was = now;
            }
            if now {
                actions.want("w", None);
            }
            actions.run(&mut fake).await.unwrap();
            tokio::time::sleep(TICK).await;
        }
        fake
    });
    let local = tokio::task::LocalSet::new();
    let handles: Vec<_> = runs.map(|run| local.spawn_local(run)).collect();
    let fakes = local
        .run_until(async {
            let mut fakes = Vec::new();
            for handle in handles {
                fakes.push(handle.await.unwrap());
            }
            fakes
        })
        .await;

    // 1. The floor is crossed for no longer than one re-check.
    let floor = g.floor(agents + case.extra_members);
    let bound = SETTLE + Duration::from_millis(2 * case.max_delay_ms + 1);
    let history = cluster.borrow().history.clone();
    let mut crossed_since: Option<Instant> = None;
    for (at, left) in history.iter().chain([(Instant::now(), usize::MAX)].iter()) {
        match (crossed_since, *left < floor) {
            (None, true) => crossed_since = Some(*at),
            (Some(since), false) => {
                prop_assert!(
                    *at - since <= bound,
                    "below the floor for {:?} (bound {bound:?}) from {:?}",
                    *at - since,
                    since - start
                );
                crossed_since = None;
            }
            _ => {}
        }
    }
    // 2. Nothing was acted on for a worker the protocol knew healthy, and
    // at the end only unhealthy workers' members are taken.
    for (fake, log) in fakes.iter().zip(&logs) {
        prop_assert!(log.borrow().acts.iter().all(|unhealthy| *unhealthy));
        if cluster.borrow().taken[&fake.member] {
            prop_assert!(
                fake.unhealthy(),
                "{} taken for a healthy worker",
                fake.member
            );
        }
    }
    // 3. A refusal is said once: never twice in a row with no action of
    // that agent in between (a new episode, or a new take given back
    // again, may say it again).
    for log in &logs {
        let timeline = &log.borrow().timeline;
        for pair in timeline.windows(2) {
            let said =
                |k: EventKind| matches!(k, EventKind::GuardBlocked | EventKind::ActionRefused);
            let same = pair[0].is_some()
                && pair[0] == pair[1]
                && pair[0].as_ref().is_some_and(|(k, _)| said(*k));
            prop_assert!(!same, "said twice: {:?}", pair[0]);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_floor_holds_nothing_stale_is_acted_on_refusals_are_said_once(case in case()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(model(case))?;
    }
}
