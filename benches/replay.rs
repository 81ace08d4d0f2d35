//! The replay table: lookup-and-join cost with 100,000 retained keys, the full duplicate-call path through
//! admission, and bytes per retained entry (counted by a global allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::prelude::World;
use bevy_agent_tools::internals::{canonical_arguments, Begin, ReplayKey, ReplayTable};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
use bevy_agent_tools::{CallOutcome, CallOutput, CallRequest, LocationRevision, OperationId, ReplayRetention, VisitId};
use criterion::{criterion_group, criterion_main, Criterion};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::hint::black_box;

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const RETAINED: usize = 100_000;

fn key(n: usize) -> ReplayKey {
    ReplayKey {
        tool: "place_block".into(),
        task: "3f2b8c1e-5d6a-4e7f-9a0b-1c2d3e4f5a6b".into(),
        location: Some(LocationRevision(2)),
        operation: OperationId::new(format!("op-7c9e6679-7425-40de-944b-{n:012}")),
    }
}

fn arguments(n: usize) -> String {
    canonical_arguments(&json!({ "x": n % 512, "y": 64, "z": -3, "block": "stone" }))
}

fn outcome() -> CallOutcome {
    Ok(CallOutput {
        value: json!({ "block": "stone", "version": 3 }),
        observed: VisitInfo {
            visit: VisitId(1),
            world: "alpha".into(),
            location: Location { dimension: "overworld".into(), revision: LocationRevision(2) },
        },
    })
}

fn filled_table() -> ReplayTable<Arc<()>, CallOutcome> {
    let retention =
        ReplayRetention { max_entries: RETAINED, max_age: Duration::from_secs(3600), max_bytes: usize::MAX };
    let mut table = ReplayTable::new(retention);
    let now = Instant::now();
    for n in 0..RETAINED {
        table.start(key(n), &arguments(n), Arc::new(()));
        table.complete(&key(n), outcome(), 0, now);
    }
    table
}

fn table_lookup(c: &mut Criterion) {
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut table = filled_table();
    let bytes = LIVE_BYTES.load(Ordering::Relaxed) - before;
    println!(
        "replay table: {RETAINED} retained entries use {bytes} bytes = {} bytes per entry",
        bytes / RETAINED as isize
    );

    let keys: Vec<(ReplayKey, String)> =
        (0..1024).map(|i| (key(i * 97 % RETAINED), arguments(i * 97 % RETAINED))).collect();
    let now = Instant::now();
    let mut i = 0;
    c.bench_function("replay_lookup_retained_at_100k", |b| {
        b.iter(|| {
            let (key, args) = &keys[i % keys.len()];
            i += 1;
            match table.begin(black_box(key), black_box(args), now) {
                Begin::Retained(outcome) => black_box(outcome),
                _ => unreachable!("retained"),
            }
        })
    });
    let running = key(RETAINED + 1);
    table.start(running.clone(), "{}", Arc::new(()));
    c.bench_function("replay_join_in_flight_at_100k", |b| {
        b.iter(|| match table.begin(black_box(&running), "{}", now) {
            Begin::Join(execution) => black_box(execution),
            _ => unreachable!("in flight"),
        })
    });
}

struct Game;
impl WorldLifecycle for Game {
    type Session = ();
    fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<()>, OpenError> {
        Ok(Opened::ready(()))
    }
    fn close(&self, _: (), _: &mut World) -> Completion {
        Completion::done()
    }
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Place {
    x: i32,
    y: i32,
    z: i32,
    block: String,
}

fn duplicate_call(c: &mut Criterion) {
    let tool = AgentTool::new("place_block", "Places.", |_: CallContext<()>, _: Place| async move { Ok(()) });
    let retention =
        ReplayRetention { max_entries: RETAINED, max_age: Duration::from_secs(3600), max_bytes: usize::MAX };
    let mut app = headless_app(AgentToolsPlugin::new(Game).replay_retention(retention).with_tool(tool));
    app.enter_world("bench");
    let conversation = app.agent().conversation("bench");
    let request = |n: usize| {
        CallRequest::new("place_block", json!({ "x": n % 512, "y": 64, "z": -3, "block": "stone" }))
            .operation(format!("op-{n}"))
    };
    for n in 0..RETAINED {
        let call = conversation.request(request(n));
        call.wait_timeout(Duration::from_secs(10)).expect("resolved").expect("ok");
    }
    let mut n = 0;
    c.bench_function("duplicate_call_admission_at_100k_retained", |b| {
        b.iter(|| {
            n = (n + 7919) % RETAINED;
            let call = conversation.request(request(n));
            black_box(call.try_outcome().expect("retained"))
        })
    });
}

criterion_group!(benches, table_lookup, duplicate_call);
criterion_main!(benches);
