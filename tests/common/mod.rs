//! A small game for the host tests: a lifecycle that records what the host called, and tools that count what
//! they did to the world.
#![allow(dead_code)]

pub mod game_log;
pub mod lines;
pub mod raw_mcp;
pub mod warnings;
pub mod window;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, Gate};
use bevy_agent_tools::{Completer, NoArgs, VisitId, WorldId};
use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the host did to the lifecycle, in order.
#[derive(Default)]
pub struct Record {
    pub events: Mutex<Vec<String>>,
    pub opens: AtomicUsize,
    pub closes: AtomicUsize,
    pub input_asks: AtomicUsize,
    /// How many times `tick` ran.
    pub ticks: AtomicUsize,
    /// What a call made from inside `close` got: it must be rejected, admission being closed.
    pub call_during_close: Mutex<Vec<Option<ErrorCode>>>,
    /// What a player's input observed from inside `close` got at once (`None`: no refusal at once).
    pub input_during_close: Mutex<Vec<Option<ErrorCode>>>,
}

impl Record {
    pub fn events(&self) -> Vec<String> {
        self.events.lock().clone()
    }
    fn push(&self, event: String) {
        self.events.lock().push(event);
    }
}

/// Per-visit state: which visit it belongs to and a counter tools bump.
pub struct Session {
    pub visit: VisitId,
    pub world: WorldId,
    pub counter: u64,
    /// The location revision, as `relocated` last said.
    pub revision: u64,
    /// How many frames ticked this session.
    pub ticks: u64,
}

/// Everything tools did to the world, tagged with the visit of the session they ran against.
#[derive(Resource, Default)]
pub struct WorldLog(pub Vec<(VisitId, String)>);

#[derive(Default)]
pub struct TestGame {
    pub record: Arc<Record>,
    /// Worlds whose `open` fails.
    pub failing: Vec<WorldId>,
    /// When set, `open` returns a loading session whose readiness this completer resolves.
    pub loading: Arc<Mutex<Option<Completer>>>,
    pub load_async: bool,
    /// The observations `input_context` returns, one per ask; `None` once they run out.
    pub observations: Arc<Mutex<Vec<Option<Value>>>>,
}

impl WorldLifecycle for TestGame {
    type Session = Session;

    fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<Session>, OpenError> {
        self.record.opens.fetch_add(1, Ordering::SeqCst);
        self.record.push(format!("open {} {}", visit.world, visit.visit));
        if self.failing.contains(&visit.world) {
            return Err(OpenError::new(format!("save `{}` is corrupt", visit.world)));
        }
        world.get_resource_or_insert_with(WorldLog::default);
        let session = Session { visit: visit.visit, world: visit.world.clone(), counter: 0, revision: 0, ticks: 0 };
        if self.load_async {
            let (completer, ready) = Completion::pending();
            *self.loading.lock() = Some(completer);
            return Ok(Opened::loading(session, ready));
        }
        Ok(Opened::ready(session))
    }

    fn tick(&self, session: &mut Session, _world: &mut World) {
        self.record.ticks.fetch_add(1, Ordering::SeqCst);
        session.ticks += 1;
    }

    fn relocated(&self, session: &mut Session, from: &Location, to: &Location, _world: &mut World) {
        session.revision = to.revision.0;
        let [from, to] = [from, to].map(|at| format!("{}@{}", at.dimension, at.revision));
        self.record.push(format!("relocated {} {from}->{to}", session.visit));
    }

    fn close(&self, session: Session, world: &mut World) -> Completion {
        self.record.closes.fetch_add(1, Ordering::SeqCst);
        self.record.push(format!("close {} {}", session.world, session.visit));
        let probe = world.resource::<AgentHandle>().conversation("probe").call("bump", serde_json::json!({}));
        self.record.call_during_close.lock().push(probe.try_outcome().and_then(|o| o.err()).map(|e| e.code));
        use std::future::Future as _;
        let mut observing = std::pin::pin!(world.resource::<AgentHandle>().conversation("probe").observe_input());
        let at_once = observing.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        let refused = match at_once {
            std::task::Poll::Ready(Err(error)) => Some(error.code),
            _ => None,
        };
        self.record.input_during_close.lock().push(refused);
        Completion::done()
    }

    fn input_context(&self, session: &Session, _world: &World) -> Option<Value> {
        self.record.input_asks.fetch_add(1, Ordering::SeqCst);
        let mut observations = self.observations.lock();
        let next = if observations.is_empty() { None } else { observations.remove(0) };
        next.map(|mut value| {
            value["visit"] = serde_json::json!(session.visit);
            value
        })
    }
}

#[derive(Deserialize, JsonSchema)]
pub struct BumpArgs {
    /// How much to add.
    #[serde(default = "one")]
    pub by: u64,
}

fn one() -> u64 {
    1
}

#[derive(Serialize, JsonSchema)]
pub struct Bumped {
    pub counter: u64,
}

/// Adds to the session's counter and logs it in the world; counts executions of the main-thread step.
pub fn bump_tool(name: &str, scope: ToolScope, executions: Arc<AtomicUsize>, gate: Option<Gate>) -> AgentTool<Session> {
    bump_tool_answered(name, scope, executions, answers(), gate)
}

/// A count of answers that can be awaited: an open [`Gate`], whose arrivals are the answers.
pub fn answers() -> Gate {
    let answers = Gate::new();
    answers.open();
    answers
}

/// [`bump_tool`], also counting the handlers whose step was answered (it ran, or the host refused it) in
/// `answered` ([`answers`]). A test that shows a step never ran waits for its answer first: a handler parked at a
/// gate reaches `on_client` only some time after the gate opens, on a worker thread, so a count read before then
/// is 0 whatever the host does.
pub fn bump_tool_answered(
    name: &str,
    scope: ToolScope,
    executions: Arc<AtomicUsize>,
    answered: Gate,
    gate: Option<Gate>,
) -> AgentTool<Session> {
    let tool_name = name.to_string();
    AgentTool::new(name, "Adds to the counter.", move |ctx: CallContext<Session>, args: BumpArgs| {
        let (executions, answered, gate, tool_name) =
            (executions.clone(), answered.clone(), gate.clone(), tool_name.clone());
        async move {
            if let Some(gate) = gate {
                gate.pass().await;
            }
            let counter = ctx
                .on_client(move |world, session| {
                    executions.fetch_add(1, Ordering::SeqCst);
                    session.counter += args.by;
                    world.resource_mut::<WorldLog>().0.push((session.visit, tool_name));
                    session.counter
                })
                .await;
            answered.pass().await;
            Ok(Bumped { counter: counter? })
        }
    })
    .scope(scope)
}

/// A game with `bump` (World scope), `bump_here` (Location scope), `panics` and `panics_on_client`.
///
/// Its pump budget is generous: a step queued before a frame (or before a wait between frames) runs in it even
/// when this shared machine deschedules the test for longer than the default 1 ms. The budget's own tests set
/// theirs.
pub fn app_with(game: TestGame, tools: Vec<AgentTool<Session>>) -> App {
    let mut plugin = AgentToolsPlugin::new(game)
        .pump_budget(std::time::Duration::from_secs(10))
        .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
        .with_tool(bump_tool("bump_here", ToolScope::Location, Arc::default(), None))
        .with_tool(AgentTool::new(
            "panics",
            "Panics in its handler.",
            |_ctx: CallContext<Session>, _: NoArgs| async move {
                if true {
                    panic!("handler exploded");
                }
                Ok(())
            },
        ))
        .with_tool(AgentTool::new(
            "panics_on_client",
            "Panics in its main-thread step.",
            |ctx: CallContext<Session>, _: NoArgs| async move {
                ctx.on_client(|_, _| -> () { panic!("step exploded") }).await?;
                Ok(())
            },
        ));
    for tool in tools {
        plugin = plugin.with_tool(tool);
    }
    headless_app(plugin)
}

pub fn code(outcome: &bevy_agent_tools::CallOutcome) -> Option<ErrorCode> {
    outcome.as_ref().err().map(|error| error.code.clone())
}

/// The Python of a venv holding the official MCP client pinned in tests/e2e/requirements.txt, created on first
/// use by tests/e2e/setup-venv.sh (needs `python3`, and PyPI the first time).
pub fn python_mcp_client() -> std::path::PathBuf {
    let venv = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-venv");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/setup-venv.sh");
    let output = std::process::Command::new("bash").arg(script).arg(&venv).output().expect("run setup-venv.sh");
    assert!(
        output.status.success(),
        "could not set up the Python MCP client (needs python3 and PyPI access):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// A game in world `alpha` with a World- or Location-scoped `name` tool whose handler parks at the returned gate
/// before its one step, and a count of the steps that ran.
pub fn gated_app(name: &str, scope: ToolScope) -> (App, Gate, Arc<AtomicUsize>) {
    let (app, gate, executions, _) = gated_app_answered(name, scope);
    (app, gate, executions)
}

/// [`gated_app`], with the count of its handlers whose step was answered ([`bump_tool_answered`]).
pub fn gated_app_answered(name: &str, scope: ToolScope) -> (App, Gate, Arc<AtomicUsize>, Gate) {
    let gate = Gate::new();
    let (executions, answered) = (Arc::new(AtomicUsize::new(0)), answers());
    let tool = bump_tool_answered(name, scope, executions.clone(), answered.clone(), Some(gate.clone()));
    let mut app = app_with(TestGame::default(), vec![tool]);
    bevy_agent_tools::testing::AgentTestAppExt::enter_world(&mut app, "alpha");
    (app, gate, executions, answered)
}

/// An example of this package (the sandbox, the scripted ACP agent) next to the test's own binary:
/// `<target>/<profile>/examples/NAME`, built with cargo first (a no-op when `cargo test` already built it).
pub fn example(name: &str) -> std::path::PathBuf {
    example_with(name, &[])
}

/// [`example`], built with extra cargo features (e.g. `window`).
pub fn example_with(name: &str, features: &[&str]) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe.parent().and_then(std::path::Path::parent).expect("<target>/<profile>/deps/<test>");
    let target_dir = profile_dir.parent().expect("<target>/<profile>");
    let mut build = std::process::Command::new(env!("CARGO"));
    build.args(["build", "--example", name]).env("CARGO_TARGET_DIR", target_dir);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    // The test's own profile (`debug` is the folder of `dev`): `release`, or a custom one.
    match profile_dir.file_name().and_then(|profile| profile.to_str()) {
        Some("debug") | None => {}
        Some(profile) => {
            build.args(["--profile", profile]);
        }
    }
    let status = build.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("cargo runs");
    assert!(status.success(), "cargo build --example {name} --features {features:?} failed");
    profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// Waits (up to `within`) until the runtime of `metrics` has at most `before` + 5 tasks alive again, and fails
/// saying `after` otherwise: tasks of finished work (a timeout that should stop watching) end when the runtime
/// next polls them, so the count is polled.
pub fn wait_tasks_back_to(
    metrics: &tokio::runtime::RuntimeMetrics,
    before: usize,
    after: &str,
    within: std::time::Duration,
) {
    let until = std::time::Instant::now() + within;
    while metrics.num_alive_tasks() > before + 5 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let alive = metrics.num_alive_tasks();
    assert!(alive <= before + 5, "{alive} tasks alive, {before} before {after}");
}
