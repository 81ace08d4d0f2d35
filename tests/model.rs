//! The host against a reference model, over random programs of calls (World and Location scope, keyed and not,
//! some with a zero timeout), cancels, enter, travel and exit, with frames stepped explicitly and each visit's
//! state saved through the world store and loaded by the next visit of its world.
//!
//! Checked after every frame: a step ran only for its own visit and (Location scope) revision, and exactly the
//! steps the rules allow ran, once (H8, H9); every call that ended has the outcome the model predicts: a
//! duplicate of a keyed operation shares its execution's outcome, a key reused with other arguments is
//! `OPERATION_CONFLICT` and runs nothing (H12), a call past its deadline is `TIMEOUT` and its step never runs;
//! the counter each world saves goes on from where its previous visit left it, so a load never saw a save out of
//! order (H7). At the end every admitted call has reached exactly one outcome (H13).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy_agent_tools::persist::{Loaded, WorldStore, WorldStorePlugin};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{
    Call, CallOutcome, CallRequest, ConversationEvent, RequestId, Subscription, VisitId, VisitPhase, WorldId,
};
use parking_lot::Mutex;
use proptest::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

const WORLDS: [&str; 2] = ["alpha", "beta"];

#[derive(Clone, Debug)]
enum Op {
    Call { scope: ToolScope, key: Option<(u8, u8)>, zero_timeout: bool },
    Cancel(usize),
    Enter(u8),
    Travel(u8),
    Exit,
    Frame,
}

fn op() -> impl Strategy<Value = Op> {
    let scope = prop_oneof![Just(ToolScope::World), Just(ToolScope::Location)];
    // Three operation ids, two argument variants: duplicates, joins and conflicts all happen often.
    let key = prop::option::weighted(0.5, (0u8..3, 0u8..2));
    prop_oneof![
        6 => (scope, key, prop::bool::weighted(0.1))
            .prop_map(|(scope, key, zero_timeout)| Op::Call { scope, key, zero_timeout }),
        1 => (0usize..40).prop_map(Op::Cancel),
        2 => (0u8..2).prop_map(Op::Enter),
        2 => (0u8..2).prop_map(Op::Travel),
        1 => Just(Op::Exit),
        3 => Just(Op::Frame),
    ]
}

// ---------------------------------------------------------------------------------------------------------------
// The game: a counter per world, loaded by `open` and saved by `close` through the world store.

#[derive(Serialize, Deserialize, Clone, Default)]
struct Saved {
    count: u64,
}

struct Session {
    world: WorldId,
    visit: VisitId,
    revision: u64,
    saved: Loaded<Saved>,
}

struct PersistedGame;

impl WorldLifecycle for PersistedGame {
    type Session = Session;

    fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<Session>, OpenError> {
        let (saved, ready) = world.resource::<WorldStore>().load_in_background(&visit.world, "saved", Saved::default);
        let session = Session { world: visit.world.clone(), visit: visit.visit, revision: 0, saved };
        Ok(Opened::loading(session, ready))
    }

    fn relocated(&self, session: &mut Session, _from: &Location, to: &Location, _world: &mut World) {
        session.revision = to.revision.0;
    }

    fn close(&self, session: Session, world: &mut World) -> Completion {
        match session.saved.take() {
            Some(saved) => world.resource::<WorldStore>().save(&session.world, "saved", saved),
            None => Completion::failed("closed before it loaded"),
        }
    }
}

#[derive(Deserialize, Serialize, JsonSchema)]
struct Args {
    /// The model's index of the call whose execution this is (a duplicate sends its original's).
    tag: usize,
    /// Keyed calls: two variants of arguments per operation id.
    #[serde(default)]
    variant: u8,
}

/// A step that ran, as the session saw it.
#[derive(Clone, Debug)]
struct Ran {
    tag: usize,
    world: WorldId,
    visit: VisitId,
    revision: u64,
    /// The world's saved counter after this step.
    count: u64,
}

type RanLog = Arc<Mutex<Vec<Ran>>>;

fn counting_tool(name: &str, scope: ToolScope, ran: RanLog) -> AgentTool<Session> {
    AgentTool::new(name, "Adds one to the world's counter.", move |ctx: CallContext<Session>, args: Args| {
        let ran = ran.clone();
        async move {
            ctx.on_client(move |_, session| {
                let Some(saved) = session.saved.get_mut() else { return Err("ran before the session loaded") };
                saved.count += 1;
                let entry = Ran {
                    tag: args.tag,
                    world: session.world.clone(),
                    visit: session.visit,
                    revision: session.revision,
                    count: saved.count,
                };
                ran.lock().push(entry);
                Ok(())
            })
            .await?
            .map_err(ToolError::internal)
        }
    })
    .scope(scope)
}

// ---------------------------------------------------------------------------------------------------------------
// The model.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Admitted, its step queued: runs at the next frame unless something ends it first.
    Pending,
    Ran,
    Rejected(&'static str),
    /// A duplicate of keyed call `root`: whatever happens to `root` happens to it.
    SameAs(usize),
}

struct ModelCall {
    call: Call,
    scope: ToolScope,
    visit: VisitId,
    revision: u64,
    world: usize,
    /// What its execution does (a duplicate: the same as its original's).
    expect: Expect,
    /// Set when this caller cancelled while its execution ran: it got `CANCELLED`, whatever the execution does
    /// for the callers still waiting for it.
    cancelled: bool,
}

/// (scope, revision for Location scope, operation id): the replay key within one visit and task.
type Key = (bool, Option<u64>, u8);

struct OpenVisit {
    visit: u64,
    world: usize,
    revision: u64,
    /// Keyed operations of this visit: argument variant and the call that executes it.
    replay: HashMap<Key, (u8, usize)>,
}

#[derive(Default)]
struct Model {
    open: Option<OpenVisit>,
    visits: u64,
    calls: Vec<ModelCall>,
    /// Transitions written this frame, applied at the next frame.
    written: Vec<Op>,
}

impl Model {
    fn root(&self, mut index: usize) -> usize {
        while let Expect::SameAs(root) = self.calls[index].expect {
            index = root;
        }
        index
    }

    fn end_pending(&mut self, code: &'static str, only: impl Fn(&ModelCall) -> bool) {
        for call in self.calls.iter_mut().filter(|c| c.expect == Expect::Pending && only(c)) {
            call.expect = Expect::Rejected(code);
        }
    }

    fn frame(&mut self) {
        for op in std::mem::take(&mut self.written) {
            match op {
                Op::Enter(world) => {
                    self.end_pending("VISIT_ENDED", |_| true);
                    self.visits += 1;
                    let world = world as usize;
                    self.open = Some(OpenVisit { visit: self.visits, world, revision: 0, replay: HashMap::new() });
                }
                Op::Exit => {
                    self.end_pending("VISIT_ENDED", |_| true);
                    self.open = None;
                }
                Op::Travel(_) => {
                    if let Some(open) = self.open.as_mut() {
                        open.revision += 1;
                        self.end_pending("LOCATION_CHANGED", |call| call.scope == ToolScope::Location);
                    }
                }
                _ => unreachable!("only transitions are written"),
            }
        }
        for call in self.calls.iter_mut().filter(|c| c.expect == Expect::Pending) {
            call.expect = Expect::Ran;
        }
    }

    /// What the model says about call `index` now: `None` while it has no outcome yet.
    fn settled(&self, index: usize) -> Option<Expect> {
        if self.calls[index].cancelled {
            return Some(Expect::Rejected("CANCELLED"));
        }
        match self.calls[self.root(index)].expect {
            Expect::Pending => None,
            settled => Some(settled),
        }
    }
}

fn code_of(outcome: &CallOutcome) -> Result<(), String> {
    outcome.as_ref().map(|_| ()).map_err(|error| error.code.as_str().to_string())
}

fn wait_until_loaded(app: &App) -> Result<(), TestCaseError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.agent().visit().is_some_and(|visit| visit.phase == VisitPhase::Loading) {
        prop_assert!(Instant::now() < deadline, "the world did not load in time");
        std::thread::yield_now();
    }
    Ok(())
}

/// Checks every settled call and every step that ran against the model.
fn check(model: &Model, ran: &RanLog) -> Result<(), TestCaseError> {
    for (tag, call) in model.calls.iter().enumerate() {
        let Some(expect) = model.settled(tag) else { continue };
        let Some(outcome) = call.call.wait_timeout(Duration::from_secs(10)) else {
            return Err(TestCaseError::fail(format!("call {tag} did not resolve (expected {expect:?})")));
        };
        match expect {
            Expect::Ran => prop_assert!(outcome.is_ok(), "call {} should have run: {:?}", tag, outcome),
            Expect::Rejected(code) => prop_assert_eq!(code_of(&outcome), Err(code.to_string()), "call {}", tag),
            Expect::Pending | Expect::SameAs(_) => unreachable!("settled() resolves these"),
        }
    }
    let ran = ran.lock();
    let ran_tags: BTreeSet<usize> = ran.iter().map(|step| step.tag).collect();
    let expected: BTreeSet<usize> =
        model.calls.iter().enumerate().filter(|(_, c)| c.expect == Expect::Ran).map(|(tag, _)| tag).collect();
    prop_assert_eq!(&ran_tags, &expected, "the steps that ran are exactly those the rules allow");
    prop_assert_eq!(ran.len(), expected.len(), "no step ran twice");
    let mut per_world: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for step in ran.iter() {
        let call = &model.calls[step.tag];
        prop_assert_eq!(step.visit, call.visit, "step {} ran against another visit", step.tag);
        prop_assert_eq!(step.world.as_str(), WORLDS[call.world], "step {} ran in another world", step.tag);
        if call.scope == ToolScope::Location {
            prop_assert_eq!(step.revision, call.revision, "step {} ran at another revision", step.tag);
        }
        per_world.entry(WORLDS[call.world]).or_default().push(step.count);
    }
    for (world, counts) in per_world {
        let continuous: Vec<u64> = (1..=counts.len() as u64).collect();
        prop_assert_eq!(&counts, &continuous, "world {}'s counter skipped or restarted: a load missed a save", world);
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let data = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let ran: RanLog = Arc::default();
    let mut app = App::new();
    app.add_plugins(MinimalPlugins)
        .add_plugins(
            AgentToolsPlugin::new(PersistedGame)
                .pump_budget(Duration::from_secs(60))
                .max_in_flight_per_conversation(1_000)
                .with_tool(counting_tool("world", ToolScope::World, ran.clone()))
                .with_tool(counting_tool("here", ToolScope::Location, ran.clone())),
        )
        .add_plugins(WorldStorePlugin::new(data.path()));
    app.finish();
    app.cleanup();
    let mut events: Subscription = app.agent().subscribe();
    let agent = app.agent().conversation("model");
    let mut model = Model::default();
    let mut queued = 0;

    for op in ops.into_iter().chain([Op::Frame]) {
        match op {
            Op::Call { scope, key, zero_timeout } => {
                let tag = model.calls.len();
                let (tool, location) = match scope {
                    ToolScope::World => ("world", false),
                    _ => ("here", true),
                };
                let (visit, revision, world) =
                    model.open.as_ref().map_or((VisitId(0), 0, 0), |o| (VisitId(o.visit), o.revision, o.world));
                // A duplicate sends exactly its original's arguments; another variant conflicts.
                let replay_key = key.map(|(id, variant)| ((location, location.then_some(revision), id), variant));
                let known = replay_key.and_then(|(k, _)| model.open.as_ref().and_then(|o| o.replay.get(&k).copied()));
                let args_tag = match (known, replay_key) {
                    (Some((known_variant, root)), Some((_, variant))) if known_variant == variant => root,
                    _ => tag,
                };
                let variant = key.map_or(0, |(_, variant)| variant);
                let mut request = CallRequest::new(tool, json!({ "tag": args_tag, "variant": variant }));
                if let Some((id, _)) = key {
                    request = request.operation(format!("op-{id}"));
                }
                if zero_timeout {
                    request = request.timeout(Duration::ZERO);
                }
                let call = agent.request(request);
                let Some(open) = model.open.as_mut() else {
                    prop_assert_eq!(call.try_outcome().map(|o| code_of(&o)), Some(Err("NO_WORLD".to_string())));
                    let expect = Expect::Rejected("NO_WORLD");
                    model.calls.push(ModelCall { call, scope, visit, revision, world, expect, cancelled: false });
                    continue;
                };
                let mut expect = Expect::Pending;
                if let Some((replay_key, variant)) = replay_key {
                    match open.replay.get(&replay_key) {
                        Some(&(known, _)) if known != variant => expect = Expect::Rejected("OPERATION_CONFLICT"),
                        Some(&(_, root)) => expect = Expect::SameAs(root),
                        None => {
                            open.replay.insert(replay_key, (variant, tag));
                        }
                    }
                }
                if expect == Expect::Pending && zero_timeout {
                    // Its deadline races its handler's first step: the step is queued or not (a handler that sees
                    // its call ended queues nothing). Either way the outcome is TIMEOUT; count what was queued.
                    let outcome = call.wait_timeout(Duration::from_secs(10));
                    prop_assert_eq!(outcome.map(|o| code_of(&o)), Some(Err("TIMEOUT".to_string())));
                    expect = Expect::Rejected("TIMEOUT");
                    queued = app.agent().queued_steps();
                } else if expect == Expect::Pending {
                    // A fresh execution: its handler queues its step at once.
                    queued += 1;
                    app.wait_for_queued_steps(queued);
                }
                if let Expect::Rejected(code) = expect {
                    let outcome = call.wait_timeout(Duration::from_secs(10)).map(|o| code_of(&o));
                    prop_assert_eq!(outcome, Some(Err(code.to_string())), "call {} is refused at once", tag);
                }
                model.calls.push(ModelCall { call, scope, visit, revision, world, expect, cancelled: false });
            }
            Op::Cancel(index) => {
                if index < model.calls.len() {
                    let root = model.root(index);
                    let live = model.calls[root].expect == Expect::Pending && !model.calls[index].cancelled;
                    // A live call (or a duplicate joined to one) ends for its caller; one that has its outcome
                    // stays as it is. The execution is cancelled when no caller is left waiting for it.
                    prop_assert_eq!(model.calls[index].call.cancel(), live, "cancel of call {}", index);
                    if live {
                        model.calls[index].cancelled = true;
                        let waiting = (0..model.calls.len())
                            .filter(|&other| model.root(other) == root && !model.calls[other].cancelled)
                            .count();
                        if waiting == 0 {
                            model.calls[root].expect = Expect::Rejected("CANCELLED");
                        }
                    }
                }
            }
            Op::Enter(world) => {
                app.world_mut().write_message(EnterWorld::new(WORLDS[world as usize]));
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
                wait_until_loaded(&app)?;
                model.frame();
                queued = 0;
                check(&model, &ran)?;
            }
        }
    }

    // Every admitted call reached exactly one outcome: one `CallFinished` per `CallStarted`.
    let mut started: BTreeSet<RequestId> = BTreeSet::new();
    let mut finished: BTreeMap<RequestId, usize> = BTreeMap::new();
    while let Some(event) = events.try_next() {
        match event {
            ConversationEvent::CallStarted(call) => {
                started.insert(call.request);
            }
            ConversationEvent::CallFinished(call) => *finished.entry(call.request).or_default() += 1,
            _ => {}
        }
    }
    // Every call the host admitted (a joined or replayed duplicate carries its execution's id; one refused at
    // admission, a request id of its own but no start) is among them: else the check below would pass on a feed
    // that lost events.
    let refused_at_admission = |made: &&ModelCall| {
        matches!(made.expect, Expect::Rejected("NO_WORLD") | Expect::Rejected("OPERATION_CONFLICT"))
    };
    let admitted = model.calls.iter().filter(|made| !refused_at_admission(made));
    for request in admitted.filter_map(|made| made.call.request_id()) {
        prop_assert!(started.contains(&request), "admitted call {} was published as started", request);
    }
    for request in &started {
        prop_assert_eq!(finished.get(request).copied(), Some(1), "call {} finished exactly once", request);
    }
    prop_assert_eq!(started.len(), finished.len(), "nothing finished that never started");
    Ok(())
}

proptest! {
    // 1,000 cases by default; `PROPTEST_CASES=100000` for the long run in RELIABILITY.md.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(1_000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn h7_h8_h9_h12_h13_the_host_matches_its_model_over_random_programs(ops in prop::collection::vec(op(), 1..40)) {
        run(ops)?;
    }
}
