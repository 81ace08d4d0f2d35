//! Applying enter, travel and exit on the main thread, in the order the game asked for them.
//!
//! Each transition commits the host's state before it calls the game or ends calls (rule H13): admission closes
//! before calls end and before `close` runs (H5); the location revision increments before `relocated` runs (H2).

use std::panic::{catch_unwind, AssertUnwindSafe};

use bevy::prelude::*;

use super::messages::{
    EnterWorld, ExitWorld, TravelTo, VisitClosed, VisitClosing, VisitLoadFailed, VisitOpened, VisitRelocated,
    VisitSaved, WorldOpenFailed,
};
use super::{OpenSession, VisitSlot};
use crate::call::{run_cleanups, Job};
use crate::completion::Completion;
use crate::error::{ErrorCode, ToolError};
use crate::host::OpenVisit;
use crate::ids::{DimensionId, LocationRevision, WorldId};
use crate::lifecycle::{Location, OpenError, VisitInfo, WorldLifecycle};
use crate::panic::panic_message;
use crate::replay::ReplayTable;
use crate::tool::ToolScope;

/// A transition waiting for this frame's [`AgentToolsSystems::Transitions`](crate::AgentToolsSystems::Transitions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Enter { world: WorldId, dimension: Option<DimensionId> },
    Travel { dimension: DimensionId },
    Exit,
}

/// Transitions gathered from messages (and from a followed `States` type), ordered by creation.
#[derive(Resource, Default)]
pub(crate) struct PendingTransitions(pub Vec<(u64, Transition)>);

pub(crate) fn collect_transitions(
    mut enter: MessageReader<EnterWorld>,
    mut travel: MessageReader<TravelTo>,
    mut exit: MessageReader<ExitWorld>,
    mut pending: ResMut<PendingTransitions>,
) {
    let pending = &mut pending.0;
    pending.extend(
        enter
            .read()
            .map(|m| (m.order, Transition::Enter { world: m.world_id.clone(), dimension: m.dimension.clone() })),
    );
    pending.extend(travel.read().map(|m| (m.order, Transition::Travel { dimension: m.dimension.clone() })));
    pending.extend(exit.read().map(|m| (m.order, Transition::Exit)));
}

/// Applies this frame's transitions in order, then ticks the open session.
pub(crate) fn apply_transitions<L: WorldLifecycle>(world: &mut World) {
    world.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| {
        if slot.apply_pending(world) {
            slot.tick(world);
            slot.report_load_failure(world);
            slot.report_saved(world);
        }
    });
}

/// Applies the transitions a followed `States` type queued, in Bevy's `StateTransition` schedule: the visit a
/// state leaves is closed before that state's `OnExit` (and its `DespawnOnExit` entities go), the one it enters
/// opened before its `OnEnter`. Except in the start-up run (before `PreStartup`): those are applied in the first
/// frame with the rest, after the game's `Startup` systems.
pub(crate) fn apply_followed_transitions<L: WorldLifecycle>(world: &mut World, mut started: Local<bool>) {
    if std::mem::replace(&mut *started, true) {
        world.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| slot.apply_pending(world));
    }
}

impl<L: WorldLifecycle> VisitSlot<L> {
    /// Applies the transitions queued so far, in the order they were made. False once the game exited (its
    /// lifecycle's `shutdown` ran, its workers stopped): then they are dropped, as a world entered now would never
    /// be closed or saved, and its calls would have no worker to run on.
    fn apply_pending(&mut self, world: &mut World) -> bool {
        let mut pending = std::mem::take(&mut world.resource_mut::<PendingTransitions>().0);
        pending.sort_by_key(|(order, _)| *order);
        if self.shut_down {
            if !pending.is_empty() {
                tracing::warn!(transitions = pending.len(), "the game has exited: its world transitions are ignored");
            }
            return false;
        }
        for (_, transition) in pending {
            match transition {
                Transition::Enter { world: id, dimension } => {
                    self.exit(world);
                    self.enter(world, id, dimension);
                }
                Transition::Travel { dimension } => self.travel(world, dimension),
                Transition::Exit => self.exit(world),
            }
        }
        true
    }

    fn enter(&mut self, world: &mut World, id: WorldId, dimension: Option<DimensionId>) {
        let visit = self.host.state.lock().next_visit_id();
        let dimension = dimension.unwrap_or_else(|| self.default_dimension.clone());
        let info =
            VisitInfo { visit, world: id.clone(), location: Location { dimension, revision: LocationRevision(0) } };
        let lifecycle = self.lifecycle.clone();
        // Counted before `open` queues its load: the world stays the store's from its first operation.
        let store = world.get_resource::<crate::persist::WorldStore>().cloned();
        if let Some(store) = &store {
            store.visit_opening(&id);
        }
        let opened = catch_unwind(AssertUnwindSafe(|| lifecycle.open(&info, world)))
            .unwrap_or_else(|panic| Err(OpenError::new(format!("open panicked: {}", panic_message(&*panic)))));
        match opened {
            Ok(opened) => {
                self.loading = opened.ready.clone().map(|ready| (info.clone(), ready));
                self.host.state.lock().visit = Some(OpenVisit {
                    info: info.clone(),
                    ready: opened.ready,
                    closing: false,
                    exiting: Default::default(),
                    calls: Default::default(),
                    replay: ReplayTable::new(self.host.config.replay),
                });
                self.open = Some(OpenSession { info: info.clone(), session: opened.session, store });
                // A call made with no world open whose tool is registered waited for this.
                self.host.tool_or_visit_came.notify_waiters();
                tracing::info!(world = %id, visit = %visit, "entered world");
                world.write_message(VisitOpened { info });
            }
            Err(error) => {
                if let Some(store) = &store {
                    // Whatever `open` queued before it failed finishes first.
                    drop(store.visit_closed(&id, Completion::done()));
                }
                tracing::error!(world = %id, visit = %visit, %error, "could not open world; no visit is open");
                world.write_message(WorldOpenFailed { world: id, visit, error });
            }
        }
    }

    fn travel(&mut self, world: &mut World, dimension: DimensionId) {
        let Some(open) = self.open.as_mut() else {
            tracing::warn!(%dimension, "travel ignored: no world is open");
            return;
        };
        let from = open.info.location.clone();
        let to = Location { dimension, revision: from.revision.next() };
        open.info.location = to.clone();
        let stranded = {
            let mut state = self.host.state.lock();
            let Some(visit) = state.visit.as_mut() else { return };
            visit.info.location = to.clone();
            visit.calls.remove_where(|life| life.coords.scope == ToolScope::Location)
        };
        for life in stranded {
            life.finish(Err(ToolError::with_code(
                ErrorCode::LocationChanged,
                format!(
                    "the player moved from {} ({}) to {} ({}); this tool needs the location it was called in: look again and retry",
                    from.dimension, from.revision, to.dimension, to.revision
                ),
            )
            .with_detail("current_revision", to.revision)));
        }
        let visit = open.info.visit;
        self.lifecycle.relocated(&mut open.session, &from, &to, world);
        world.write_message(VisitRelocated { visit, from, to });
    }

    /// Exits the open visit, if any: (1) admission closes, (2) every call of the visit ends and queued steps are
    /// dropped unrun, (3) `close` runs and its completion is kept.
    pub(crate) fn exit(&mut self, world: &mut World) {
        self.loading = None;
        let Some(open) = self.open.take() else { return };
        let calls = self.host.begin_exit();
        // Those still waiting for their tool end too (admission is closed: no more join them).
        self.host.waiting_calls.end_visit(&open.info);
        world.write_message(VisitClosing { info: open.info.clone() });
        for life in calls {
            life.finish(Err(ToolError::with_code(
                ErrorCode::VisitEnded,
                format!("the player left world `{}` before the call finished", open.info.world),
            )));
        }
        // Steps still queued belong to calls that just ended: drop them unrun. Their `on_end` cleanups run now,
        // while the session is still there; a cleanup registered after this finds its visit closed and is dropped.
        let mut open = open;
        self.next_frame.get_mut().clear();
        while let Ok(job) = self.jobs.try_recv() {
            match job {
                Job::Cleanup { visit, request, cleanups, reason } if visit == open.info.visit => {
                    run_cleanups(world, &mut open.session, request, cleanups, reason)
                }
                // Steps, and input observations (their asker gets `VISIT_ENDED`), are dropped.
                _ => {}
            }
        }
        let info = open.info.clone();
        let lifecycle = self.lifecycle.clone();
        let store = open.store.take();
        let completion = catch_unwind(AssertUnwindSafe(|| lifecycle.close(open.session, world)))
            .unwrap_or_else(|panic| Completion::failed(format!("close panicked: {}", panic_message(&*panic))));
        // Resolves once the store has let the world go too (if nothing else of it is queued or running, and no
        // other visit of it is open or closing).
        let completion = match store {
            Some(store) => store.visit_closed(&info.world, completion),
            None => completion,
        };
        self.host.state.lock().visit = None;
        tracing::info!(world = %info.world, visit = %info.visit, "left world");
        self.closing.push((info.clone(), completion.clone()));
        world.write_message(VisitClosed { info, completion });
    }

    /// Reports, once, that the open visit's session failed to load; forgets its readiness once it resolved.
    fn report_load_failure(&mut self, world: &mut World) {
        let Some((info, ready)) = &self.loading else { return };
        let Some(result) = ready.result() else { return };
        if let Err(error) = result {
            tracing::error!(world = %info.world, visit = %info.visit, %error, "the world failed to load: its calls fail until it is exited");
            world.write_message(VisitLoadFailed { info: info.clone(), error });
        }
        self.loading = None;
    }

    /// Writes [`VisitSaved`] for every close completion that resolved since the last frame.
    fn report_saved(&mut self, world: &mut World) {
        let mut resolved = Vec::new();
        self.closing.retain(|(info, completion)| match completion.result() {
            Some(result) => {
                resolved.push((info.clone(), result));
                false
            }
            None => true,
        });
        for (info, result) in resolved {
            match &result {
                Ok(()) => tracing::info!(world = %info.world, visit = %info.visit, "world saved"),
                Err(error) => {
                    tracing::error!(world = %info.world, visit = %info.visit, %error, "saving the world failed")
                }
            }
            world.write_message(VisitSaved { info, result });
        }
    }

    fn tick(&mut self, world: &mut World) {
        if let Some(open) = self.open.as_mut() {
            self.lifecycle.tick(&mut open.session, world);
        }
    }
}
