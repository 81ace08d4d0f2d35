//! The contract's edges, as documented: `WorldBinding::resolve` on a call that already ended answers what the
//! call's next `on_client` answers (H9), and a retained duplicate names the request that ran (H12).

mod common;

use std::sync::Arc;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{AgentTestAppExt, Gate};
use bevy_agent_tools::{CallRequest, NoArgs};
use common::*;
use parking_lot::Mutex;

/// What `resolve` and the next `on_client` answered (`Ok` as `None`).
type Answers = Arc<Mutex<Option<(Option<ErrorCode>, Option<ErrorCode>)>>>;

/// A tool that parks at `gate`, then records what `resolve` and `on_client` answer.
fn resolver(
    scope: ToolScope,
    gate: Gate,
    binding: Arc<Mutex<Option<WorldBinding<TestGame>>>>,
    answers: Answers,
) -> AgentTool<Session> {
    AgentTool::new("resolver", "Resolves its visit after the gate.", move |ctx: CallContext<Session>, _: NoArgs| {
        let (gate, binding, answers) = (gate.clone(), binding.clone(), answers.clone());
        async move {
            gate.pass().await;
            let binding = binding.lock().clone().ok_or_else(|| ToolError::internal("no binding"))?;
            let resolved = binding.resolve(&ctx).err().map(|e| e.code);
            let stepped = ctx.on_client(|_, _| ()).await.err().map(|e| e.code);
            *answers.lock() = Some((resolved, stepped));
            Ok(())
        }
    })
    .scope(scope)
}

fn resolve_after(
    scope: ToolScope,
    transition: impl FnOnce(&mut bevy::prelude::App, &bevy_agent_tools::Call),
) -> Option<(Option<ErrorCode>, Option<ErrorCode>)> {
    let (gate, binding, answers) = (Gate::new(), Arc::new(Mutex::new(None)), Answers::default());
    let mut app = app_with(TestGame::default(), vec![resolver(scope, gate.clone(), binding.clone(), answers.clone())]);
    *binding.lock() = Some(app.world().resource::<WorldBinding<TestGame>>().clone());
    app.enter_world("alpha");
    let call = app.agent().conversation("agent").call("resolver", serde_json::json!({}));
    app.run_until("the handler is at the gate", |_| gate.arrived() == 1);
    transition(&mut app, &call);
    let _ = app.run_until_resolved(&call);
    gate.open();
    app.run_until("the handler recorded its answers", |_| answers.lock().is_some());
    let answered = answers.lock().clone();
    answered
}

#[test]
fn h9_resolve_on_a_call_ended_by_exit_answers_visit_ended_as_its_next_on_client_does() {
    let answers = resolve_after(ToolScope::World, |app, _| {
        app.exit_world();
    });
    assert_eq!(answers, Some((Some(ErrorCode::VisitEnded), Some(ErrorCode::VisitEnded))));
}

#[test]
fn h9_resolve_on_a_location_call_ended_by_travel_answers_location_changed_as_its_next_on_client_does() {
    let answers = resolve_after(ToolScope::Location, |app, _| {
        app.travel("nether");
    });
    assert_eq!(answers, Some((Some(ErrorCode::LocationChanged), Some(ErrorCode::LocationChanged))));
}

#[test]
fn h9_resolve_on_a_call_its_caller_cancelled_answers_cancelled_as_its_next_on_client_does() {
    // The visit is still open and where it was: only the call's own end can refuse it.
    let answers = resolve_after(ToolScope::Location, |_, call| {
        assert!(call.cancel(), "cancelled while its handler waits");
    });
    assert_eq!(answers, Some((Some(ErrorCode::Cancelled), Some(ErrorCode::Cancelled))));
}

#[test]
fn h12_a_retained_duplicate_reports_the_request_id_of_the_call_that_ran() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let first = conversation.request(CallRequest::new("bump", serde_json::json!({"by": 1})).operation("op"));
    assert!(app.run_until_resolved(&first).is_ok());
    let ran = first.request_id().expect("the first call was admitted");
    let duplicate = conversation.request(CallRequest::new("bump", serde_json::json!({"by": 1})).operation("op"));
    assert!(!duplicate.is_running(), "a retained outcome, nothing ran");
    assert_eq!(duplicate.request_id(), Some(ran));
    let failed = conversation.request(CallRequest::new("panics", serde_json::json!({})).operation("op-2"));
    assert_eq!(app.run_until_resolved(&failed).map_err(|error| error.code).err(), Some(ErrorCode::Internal));
    let again = conversation.request(CallRequest::new("panics", serde_json::json!({})).operation("op-2"));
    assert!(!again.is_running(), "a retained failure, nothing ran again");
    assert_eq!(again.request_id(), failed.request_id(), "a retained failure names its request too");
}

/// A tool's handler that blocks on a completion instead of awaiting it (`store.save(..).wait()`, a documented
/// call) still finishes: the work it waits for, spawned from the same worker, runs on another one meanwhile.
/// Without that, the call would never end (its driver is the blocked task: its timeout cannot fire either).
#[test]
fn h13_a_handler_blocking_on_work_it_spawned_still_finishes() {
    let blocking = AgentTool::new(
        "save_and_wait",
        "Saves, blocking until the save is done.",
        |_: CallContext<Session>, _: NoArgs| async move {
            let runtime = tokio::runtime::Handle::current();
            // Spawned from this worker, as `WorldStore::save` spawns its write.
            let saved = Completion::spawn(&runtime, async { Ok(()) });
            saved.wait()?;
            Ok("saved")
        },
    )
    .timeout(std::time::Duration::from_secs(5));
    let mut app = app_with(TestGame::default(), vec![blocking]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("save_and_wait", serde_json::json!({}));
    let outcome = app.run_until_resolved(&call);
    assert_eq!(outcome.expect("the save finished and so did the call").value, "saved");
}
