//! H8 as a property: over random interleavings of calls, cancels, enter, travel and exit within frames, a
//! queued step runs if and only if, at its pump, its call is live, its visit is the open visit and (Location
//! scope) its revision is unchanged. Checked against a model of the rules.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
use bevy_agent_tools::{Call, VisitId};
use common::*;
use parking_lot::Mutex;
use proptest::prelude::*;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

#[derive(Clone, Debug)]
enum Op {
    Call(ToolScope),
    Cancel(usize),
    Enter(u8),
    Travel(u8),
    Exit,
    Frame,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![Just(ToolScope::World), Just(ToolScope::Location)].prop_map(Op::Call),
        1 => (0usize..32).prop_map(Op::Cancel),
        2 => (0u8..2).prop_map(Op::Enter),
        2 => (0u8..2).prop_map(Op::Travel),
        1 => Just(Op::Exit),
        3 => Just(Op::Frame),
    ]
}

#[derive(Deserialize, JsonSchema)]
struct Tagged {
    tag: usize,
}

/// (tag, visit, revision) of every step that ran, as the session saw it.
type Ran = Arc<Mutex<Vec<(usize, VisitId, u64)>>>;

fn tagged_tool(name: &str, scope: ToolScope, ran: Ran) -> AgentTool<Session> {
    AgentTool::new(name, "Records that its step ran.", move |ctx: CallContext<Session>, args: Tagged| {
        let ran = ran.clone();
        async move {
            ctx.on_client(move |_, session| ran.lock().push((args.tag, session.visit, session.revision))).await?;
            Ok(())
        }
    })
    .scope(scope)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Pending,
    Ran,
    Rejected(&'static str),
}

struct ModelCall {
    call: Call,
    scope: ToolScope,
    visit: VisitId,
    revision: u64,
    expect: Expect,
}

#[derive(Default)]
struct Model {
    /// (visit number, revision) of the open visit.
    open: Option<(u64, u64)>,
    visits: u64,
    calls: Vec<ModelCall>,
    /// Transitions written this frame, applied at the next frame.
    written: Vec<Op>,
}

impl Model {
    fn end_visit(&mut self, code: &'static str) {
        for call in self.calls.iter_mut().filter(|c| c.expect == Expect::Pending) {
            call.expect = Expect::Rejected(code);
        }
        self.open = None;
    }

    fn frame(&mut self) {
        for op in std::mem::take(&mut self.written) {
            match op {
                Op::Enter(_) => {
                    if self.open.is_some() {
                        self.end_visit("VISIT_ENDED");
                    }
                    self.visits += 1;
                    self.open = Some((self.visits, 0));
                }
                Op::Exit => self.end_visit("VISIT_ENDED"),
                Op::Travel(_) => {
                    if let Some((_, revision)) = self.open.as_mut() {
                        *revision += 1;
                        for call in self.calls.iter_mut() {
                            if call.expect == Expect::Pending && call.scope == ToolScope::Location {
                                call.expect = Expect::Rejected("LOCATION_CHANGED");
                            }
                        }
                    }
                }
                _ => unreachable!(),
            }
        }
        for call in self.calls.iter_mut().filter(|c| c.expect == Expect::Pending) {
            call.expect = Expect::Ran;
        }
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let ran: Ran = Arc::default();
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .pump_budget(Duration::from_secs(60))
        .with_tool(tagged_tool("world", ToolScope::World, ran.clone()))
        .with_tool(tagged_tool("here", ToolScope::Location, ran.clone()));
    let mut app = headless_app(plugin);
    let agent = app.agent().conversation("prop");
    let mut model = Model::default();
    let mut queued = 0;
    for op in ops.into_iter().chain([Op::Frame]) {
        match op {
            Op::Call(scope) => {
                let tag = model.calls.len();
                let tool = if scope == ToolScope::World { "world" } else { "here" };
                let call = agent.call(tool, json!({ "tag": tag }));
                match model.open {
                    None => {
                        let outcome = call.try_outcome();
                        prop_assert_eq!(outcome.and_then(|o| o.err()).map(|e| e.code), Some(ErrorCode::NoWorld));
                    }
                    Some((visit, revision)) => {
                        queued += 1;
                        app.wait_for_queued_steps(queued);
                        let expect = Expect::Pending;
                        model.calls.push(ModelCall { call, scope, visit: VisitId(visit), revision, expect });
                        continue;
                    }
                }
                model.calls.push(ModelCall {
                    call,
                    scope,
                    visit: VisitId(0),
                    revision: 0,
                    expect: Expect::Rejected("NO_WORLD"),
                });
            }
            Op::Cancel(index) => {
                if let Some(call) = model.calls.get_mut(index).filter(|c| c.expect == Expect::Pending) {
                    prop_assert!(call.call.cancel());
                    call.expect = Expect::Rejected("CANCELLED");
                }
            }
            Op::Enter(world) => {
                app.world_mut().write_message(EnterWorld::new(["alpha", "beta"][world as usize]));
                model.written.push(op);
            }
            Op::Travel(dimension) => {
                app.world_mut().write_message(TravelTo::new(["overworld", "nether"][dimension as usize]));
                model.written.push(op);
            }
            Op::Exit => {
                app.world_mut().write_message(ExitWorld::new());
                model.written.push(op);
            }
            Op::Frame => {
                app.update();
                model.frame();
                queued = 0;
                for (tag, call) in model.calls.iter().enumerate() {
                    let outcome = match call.expect {
                        Expect::Pending => continue,
                        Expect::Ran => call.call.wait_timeout(Duration::from_secs(10)),
                        Expect::Rejected(_) => call.call.try_outcome(),
                    };
                    let Some(outcome) = outcome else {
                        return Err(TestCaseError::fail(format!("call {tag} did not resolve ({:?})", call.expect)));
                    };
                    match call.expect {
                        Expect::Ran => prop_assert!(outcome.is_ok(), "call {} should have run: {:?}", tag, outcome),
                        Expect::Rejected(code) => {
                            let got = outcome.err().map(|e| e.code.as_str().to_string());
                            prop_assert_eq!(got.as_deref(), Some(code), "call {}", tag);
                        }
                        Expect::Pending => {}
                    }
                }
                let ran_now: BTreeSet<usize> = ran.lock().iter().map(|(tag, _, _)| *tag).collect();
                let expected: BTreeSet<usize> =
                    model.calls.iter().enumerate().filter(|(_, c)| c.expect == Expect::Ran).map(|(t, _)| t).collect();
                prop_assert_eq!(&ran_now, &expected, "the steps that ran are exactly those the rules allow");
                prop_assert_eq!(ran.lock().len(), expected.len(), "no step ran twice");
                for (tag, visit, revision) in ran.lock().iter() {
                    let call = &model.calls[*tag];
                    prop_assert_eq!(*visit, call.visit, "step {} ran against another visit", tag);
                    if call.scope == ToolScope::Location {
                        prop_assert_eq!(*revision, call.revision, "step {} ran at another revision", tag);
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    // 1,000 cases by default; `PROPTEST_CASES=100000` for the long run in RELIABILITY.md.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(1_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn h8_steps_run_only_for_their_live_call_visit_and_revision_over_random_interleavings(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        run(ops)?;
    }
}
