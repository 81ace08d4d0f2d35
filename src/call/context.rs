//! [`CallContext`]: a handler's only way back into the game, bound to the call's own visit and location.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::ops::ControlFlow;
use std::time::Instant;

use bevy::prelude::World;

use super::{CallCore, Job, Progress};
use crate::error::{ErrorCode, ToolError};
use crate::ids::{ConversationId, OperationId, RequestId, TaskId};
use crate::lifecycle::VisitInfo;
use crate::tool::ToolScope;

/// What a handler gets with its arguments: the call's identity, its captured visit, and
/// [`on_client`](CallContext::on_client), the only way to reach the game.
///
/// A context never looks up "the current world": every step it sends to the main thread is rechecked against
/// the visit (and, for `Location` scope, the location revision) the call was admitted under (rules H8, H9).
pub struct CallContext<S> {
    core: CallCore,
    _session: PhantomData<fn(S)>,
}

impl<S> std::fmt::Debug for CallContext<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let coords = &self.core.life.coords;
        f.debug_struct("CallContext")
            .field("request", &coords.request)
            .field("tool", &coords.tool)
            .field("conversation", &coords.conversation)
            .field("visit", &coords.visit)
            .finish_non_exhaustive()
    }
}

impl<S> Clone for CallContext<S> {
    fn clone(&self) -> Self {
        Self { core: self.core.clone(), _session: PhantomData }
    }
}

impl<S: Send + Sync + 'static> CallContext<S> {
    pub(crate) fn new(core: CallCore) -> Self {
        Self { core, _session: PhantomData }
    }

    /// The request id.
    pub fn request_id(&self) -> RequestId {
        self.core.life.coords.request
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.core.life.coords.tool
    }

    /// The visit and location the call was admitted under. Never changes.
    pub fn visit(&self) -> &VisitInfo {
        &self.core.life.coords.visit
    }

    /// The tool's scope.
    pub fn scope(&self) -> ToolScope {
        self.core.life.coords.scope
    }

    /// The conversation that made the call.
    pub fn conversation(&self) -> &ConversationId {
        &self.core.life.coords.conversation
    }

    /// The task the call belongs to (the conversation id unless the agent named one).
    pub fn task(&self) -> &TaskId {
        &self.core.life.coords.task
    }

    /// The agent's operation id, if it sent one.
    pub fn operation_id(&self) -> Option<&OperationId> {
        self.core.life.coords.operation.as_ref()
    }

    /// When the call times out.
    pub fn deadline(&self) -> Instant {
        self.core.life.deadline
    }

    /// The plugin's tokio runtime, for work the handler starts and owns.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.core.host.runtime
    }

    /// Reports progress to whoever made the call (over MCP, a `notifications/progress` when the client asked
    /// for it) and to the game, as a [`CallProgress`](crate::CallProgress) event of the call's conversation.
    /// Does nothing after the call ended.
    pub fn report_progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        let life = &self.core.life;
        if life.is_ended() {
            return;
        }
        let progress = Progress { progress, total, message };
        self.core.host.conversations.call_progress(life, &progress);
        life.report_progress(&progress);
    }

    /// Records a detail (e.g. how many blocks were placed so far) that is added to the error the call ends with,
    /// whoever ends it: a travel, an exit, a cancel, a timeout, or the handler itself. Keep it current as work
    /// progresses, so an agent told `LOCATION_CHANGED` also learns what had already been done. A key that names one
    /// of the call's coordinates is kept as `detail_<key>`, as in [`ToolError::with_detail`](crate::ToolError::with_detail).
    pub fn set_detail(&self, key: impl Into<String>, value: impl serde::Serialize) {
        let key = crate::error::detail_key(key.into());
        self.core.life.set_detail(key, serde_json::to_value(value).unwrap_or(serde_json::Value::Null));
    }

    /// Whether the call is still live. A hint only: the answer can change right after it is read, so it is not
    /// permission to act; [`on_client`](Self::on_client) rechecks on the main thread.
    pub fn is_active(&self) -> bool {
        !self.core.life.is_ended()
    }

    /// Why the call ended, as its next `on_client` would answer (`CANCELLED` while it has recorded none).
    pub(crate) fn end_error(&self) -> ToolError {
        self.core.life.end_error()
    }

    /// Resolves with the reason when the call ends: cancelled, timed out, its visit ended, (`Location` scope) the
    /// player relocated, or it finished (with its error, or, after a success, `CANCELLED` saying the call already
    /// finished). Cancel-safe.
    ///
    /// Observers may stop waiting here; work the handler already started (I/O, native resources) is still the
    /// handler's to clean up (rule H10).
    pub fn ended(&self) -> Ended {
        let life = self.core.life.clone();
        Ended(Box::pin(async move {
            life.ended_token().cancelled().await;
            life.end_error()
        }))
    }

    /// Runs `step` on the main thread with the world and this call's session, and returns its result.
    ///
    /// Right before running it, on the main thread and as one step, the host checks that the call is still live
    /// (not cancelled, not timed out), that its visit is still the open visit, and (for `Location` scope) that the
    /// location revision is the one the call was admitted under. If any check fails `step` is dropped unrun and
    /// the error says why (`VISIT_ENDED`, `LOCATION_CHANGED`, `CANCELLED`, `TIMEOUT`). A panic in `step` ends
    /// the call with `INTERNAL`; the game keeps running, and the session stays as the step left it: what the step
    /// changed before it panicked stays changed, later steps see it and `close` saves it. Where a step makes
    /// changes that only make sense together, compute first and change the session last (or in an order whose
    /// every prefix is consistent).
    ///
    /// The step is queued when `on_client` is called, so steps run in the order they were asked for (FIFO, across
    /// frames when the per-frame budget runs out). Dropping the future does not unqueue the step; its result is
    /// then discarded. Keep steps small: the main thread runs them within a per-frame budget.
    ///
    /// A step that can fail returns a `Result` of its own: `ctx.on_client(|world, session| ...).await??` (the
    /// host's error first, then the step's).
    pub fn on_client<R, F>(&self, step: F) -> impl Future<Output = Result<R, ToolError>> + Send + 'static
    where
        R: Send + 'static,
        F: FnOnce(&mut World, &mut S) -> R + Send + 'static,
    {
        let (reply, result) = tokio::sync::oneshot::channel();
        let run = Box::new(move |world: &mut World, session: &mut dyn Any| {
            let session = session.downcast_mut::<S>().ok_or_else(|| wrong_session::<S>())?;
            let _ = reply.send(step(world, session));
            Ok(())
        });
        queue_and_wait(&self.core, |life| Job::Call { life, run }, result)
    }
}

impl<S: Send + Sync + 'static> CallContext<S> {
    /// Runs `step` on the main thread once per frame, until it returns [`ControlFlow::Break`] with the result:
    /// for actions that take several frames (slide a paddle, walk a path, play an animation), with no timer or
    /// async runtime of the author's.
    ///
    /// Every frame's run is rechecked first, exactly as an [`on_client`](Self::on_client) step is (call live,
    /// deadline not passed, same visit, and for `Location` scope the same location revision), so the steps stop
    /// when the call ends: the future then resolves with why (`CANCELLED`, `TIMEOUT`, `VISIT_ENDED`,
    /// `LOCATION_CHANGED`), and the step never runs again; so when its future is dropped (a timeout won, a `select!`
    /// took another branch), unlike an `on_client` step, which runs anyway. It runs at most once per frame, in
    /// [`AgentToolsSystems::Pump`](crate::AgentToolsSystems::Pump); a panic in it ends the call with `INTERNAL` (and
    /// leaves the session as it left it, as for [`on_client`](Self::on_client)). To
    /// report progress or record details from inside it, move a clone of the context into it.
    ///
    /// ```
    /// # use std::ops::ControlFlow;
    /// # use bevy_agent_tools::prelude::*;
    /// struct Paddle { x: f32 }
    /// # #[derive(serde::Deserialize, schemars::JsonSchema)] struct Move { to: f32 }
    /// let slide = AgentTool::new("slide", "Slides the paddle to `to`.", |ctx: CallContext<Paddle>, args: Move| async move {
    ///     let x = ctx.every_frame(move |_world, paddle| {
    ///         paddle.x += (args.to - paddle.x).clamp(-4.0, 4.0); // at most 4 units a frame
    ///         if paddle.x == args.to { ControlFlow::Break(paddle.x) } else { ControlFlow::Continue(()) }
    ///     })
    ///     .await?;
    ///     Ok(serde_json::json!({ "x": x }))
    /// });
    /// ```
    pub fn every_frame<R, F>(&self, mut step: F) -> impl Future<Output = Result<R, ToolError>> + Send + 'static
    where
        R: Send + 'static,
        F: FnMut(&mut World, &mut S) -> ControlFlow<R> + Send + 'static,
    {
        let (reply, result) = tokio::sync::oneshot::channel();
        let mut reply = Some(reply);
        let run = Box::new(move |world: &mut World, session: &mut dyn Any| {
            // Nobody waits for it any more (the handler dropped the future: a timeout won, say): it stops, rather
            // than go on changing the world every frame until the call ends.
            if reply.as_ref().is_some_and(|reply| reply.is_closed()) {
                return Ok(true);
            }
            let session = session.downcast_mut::<S>().ok_or_else(|| wrong_session::<S>())?;
            match step(world, session) {
                ControlFlow::Continue(()) => Ok(false),
                ControlFlow::Break(done) => {
                    if let Some(reply) = reply.take() {
                        let _ = reply.send(done);
                    }
                    Ok(true)
                }
            }
        });
        queue_and_wait(&self.core, |life| Job::EveryFrame { life, run }, result)
    }

    /// Resolves at the start of the next frame's [`AgentToolsSystems::Pump`](crate::AgentToolsSystems::Pump), or with
    /// why the call ended, if it ends first. A step queued with [`on_client`](Self::on_client) right after it runs in
    /// that frame or the next, so a loop of `next_frame` then `on_client` takes at most one step per frame.
    /// Cancel-safe.
    pub fn next_frame(&self) -> impl Future<Output = Result<(), ToolError>> + Send + 'static {
        let life = self.core.life.clone();
        let mut frames = self.core.host.frames.subscribe();
        frames.borrow_and_update();
        // A loop that sleeps between events would not run that frame otherwise.
        self.core.host.jobs.wake();
        async move {
            if life.is_ended() {
                return Err(life.end_error());
            }
            tokio::select! {
                biased;
                _ = life.ended_token().cancelled() => Err(life.end_error()),
                changed = frames.changed() => changed.map_err(|_| life.end_error()),
            }
        }
    }

    /// Runs `cleanup` on the main thread when the call ends, however it ends: success, an error of its own, a
    /// cancel, a timeout, a travel (`LOCATION_CHANGED`) or the visit's exit. It gets the world, the call's
    /// session and why the call ended (`None` when it succeeded). For what a handler set going in the game and
    /// must stop: the paddle still sliding, a lock on an entity (rule H10: the producer owns its cleanup).
    ///
    /// It runs while the call's visit is still open: in the [`Pump`](crate::AgentToolsSystems::Pump) of the frame
    /// the call ended in (or the next one, when it ended after that frame's pump ran; or between the two under a
    /// runner that serves steps there, see [`StepPoints`](crate::StepPoints)), in order with other steps;
    /// when the visit exits (by [`ExitWorld`](crate::ExitWorld), [`EnterWorld`](crate::EnterWorld) for any world, or
    /// `AppExit`), right
    /// after the visit's calls end and before `close` gets the session. After a travel it runs in the new
    /// location, unlike a step. Registered after the call ended, it runs at the next pump all the same if the
    /// visit is still open. It never runs once its visit has closed: it is then dropped unrun (after `AppExit` no
    /// further frame runs either). A panic in it is caught and logged.
    ///
    /// ```
    /// # use bevy_agent_tools::prelude::*;
    /// struct Paddle { velocity: f32 }
    /// let push = AgentTool::new("push", "Sets the paddle moving.", |ctx: CallContext<Paddle>, _: NoArgs| async move {
    ///     ctx.on_end(|_world, paddle, _why| paddle.velocity = 0.0); // whatever happens, it stops
    ///     ctx.on_client(|_world, paddle| paddle.velocity = 3.0).await?;
    ///     Ok(())
    /// });
    /// ```
    pub fn on_end<F>(&self, cleanup: F)
    where
        F: FnOnce(&mut World, &mut S, Option<&ToolError>) + Send + 'static,
    {
        self.core.life.on_end(Box::new(move |world: &mut World, session: &mut dyn Any, reason| {
            match session.downcast_mut::<S>() {
                Some(session) => cleanup(world, session, reason),
                None => tracing::error!("{}", wrong_session::<S>().message),
            }
        }));
    }
}

/// Queues a main-thread job of the call (none once it ended) and waits for its reply or the call's end.
fn queue_and_wait<R: Send + 'static>(
    core: &CallCore,
    job: impl FnOnce(std::sync::Arc<super::CallLife>) -> Job,
    result: tokio::sync::oneshot::Receiver<R>,
) -> impl Future<Output = Result<R, ToolError>> + Send + 'static {
    let life = core.life.clone();
    let queued = !life.is_ended();
    // The call may end here, and the exit drain the queue, before the step is queued: the pump refuses a step of
    // an ended call.
    crate::sync::may_switch_threads();
    if queued && core.host.jobs.send(job(life.clone())).is_err() {
        life.fail(ErrorCode::VisitEnded, "the game stopped before this step could run");
    }
    async move {
        if !queued {
            return Err(life.end_error());
        }
        tokio::select! {
            biased;
            result = result => result.map_err(|_| life.end_error()),
            _ = life.ended_token().cancelled() => Err(life.end_error()),
        }
    }
}

fn wrong_session<S>() -> ToolError {
    ToolError::internal(format!(
        "the open world's session is not a {}: register tools for the lifecycle's session type",
        std::any::type_name::<S>()
    ))
}

/// The future returned by [`CallContext::ended`]: resolves with why the call ended. Does nothing unless awaited
/// (or polled, as in `select!`).
#[must_use = "a future does nothing unless awaited"]
pub struct Ended(std::pin::Pin<Box<dyn Future<Output = ToolError> + Send>>);

impl std::fmt::Debug for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ended").finish_non_exhaustive()
    }
}

impl Future for Ended {
    type Output = ToolError;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<ToolError> {
        self.0.as_mut().poll(cx)
    }
}
