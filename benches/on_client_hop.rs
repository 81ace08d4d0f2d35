//! The `on_client` hop: a handler on a tokio worker queues a step, the main-thread pump runs it, the result goes
//! back. Measured two ways: one call round trip (admission, handler, one step, one frame, outcome), and a batch
//! of steps pumped in one frame (the per-step cost of the hop itself).

use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::CounterGame;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
use bevy_agent_tools::NoArgs;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, JsonSchema)]
struct Steps {
    steps: usize,
}

fn app() -> App {
    let one = AgentTool::new("one", "One step.", |ctx: CallContext<u64>, _: NoArgs| async move {
        ctx.on_client(|_, n| {
            *n += 1;
            *n
        })
        .await
    });
    let many = AgentTool::new("many", "Many steps.", |ctx: CallContext<u64>, args: Steps| async move {
        let steps: Vec<_> = (0..args.steps).map(|_| ctx.on_client(|_, n| *n += 1)).collect();
        for step in steps {
            step.await?;
        }
        Ok(())
    });
    let plugin = AgentToolsPlugin::new(CounterGame).pump_budget(Duration::from_secs(1)).with_tool(one).with_tool(many);
    let mut app = headless_app(plugin);
    app.enter_world("bench");
    app
}

fn round_trip(c: &mut Criterion) {
    let mut app = app();
    let conversation = app.agent().conversation("bench");
    c.bench_function("call_round_trip_one_step", |b| {
        b.iter(|| {
            let call = conversation.call("one", json!({}));
            app.run_until_resolved(&call).expect("ok")
        })
    });
}

fn hop_batch(c: &mut Criterion) {
    const STEPS: usize = 1_000;
    let mut app = app();
    let conversation = app.agent().conversation("bench");
    let mut group = c.benchmark_group("on_client_hop");
    group.throughput(Throughput::Elements(STEPS as u64));
    group.bench_function("pump_1000_steps_one_frame", |b| {
        b.iter_custom(|iterations| {
            let mut measured = Duration::ZERO;
            for _ in 0..iterations {
                let call = conversation.call("many", json!({ "steps": STEPS }));
                app.wait_for_queued_steps(STEPS);
                let started = Instant::now();
                app.update();
                call.wait_timeout(Duration::from_secs(10)).expect("resolved").expect("ok");
                measured += started.elapsed();
            }
            measured
        })
    });
    group.finish();
}

criterion_group!(benches, round_trip, hop_batch);
criterion_main!(benches);
