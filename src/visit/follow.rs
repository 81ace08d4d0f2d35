//! Following a `States` type of the game's own: each change of state becomes enter, travel or exit.

use bevy::prelude::*;
use bevy::state::state::States;

use super::messages::next_order;
use super::{PendingTransitions, Transition};
use crate::host::HostShared;
use crate::ids::{DimensionId, WorldId};

type StateMap<S> = dyn Fn(&S) -> Option<(WorldId, DimensionId)> + Send + Sync;

/// Maps the game's state to where the player is: `Some((world, dimension))` inside a world, `None` outside.
#[derive(Resource)]
pub(crate) struct StateTarget<S: States> {
    pub map: Box<StateMap<S>>,
    pub host: std::sync::Arc<HostShared>,
}

/// On every change of `State<S>`, compares where the state says the player is with the open visit, and queues
/// the transitions that make them agree. A sub-state's or computed state's `State<S>` is removed when its source
/// no longer allows it (the player went back to the menu): that is a change to outside any world, as a state
/// mapped to `None` is. `existed` is whether `State<S>` was there when this last ran.
pub(crate) fn follow_state<S: States>(
    state: Option<Res<State<S>>>,
    target: Res<StateTarget<S>>,
    mut pending: ResMut<PendingTransitions>,
    mut existed: Local<bool>,
) {
    let wanted = match &state {
        Some(state) if state.is_changed() || !*existed => (target.map)(state.get()),
        Some(_) => return,
        None if *existed => None,
        None => return,
    };
    *existed = state.is_some();
    let open = target.host.status().map(|status| (status.info.world, status.info.location.dimension));
    let transitions = match (open, wanted) {
        (None, None) => vec![],
        (Some(_), None) => vec![Transition::Exit],
        (None, Some((world, dimension))) => vec![Transition::Enter { world, dimension: Some(dimension) }],
        (Some((open_world, open_dimension)), Some((world, dimension))) => {
            if open_world != world {
                vec![Transition::Enter { world, dimension: Some(dimension) }]
            } else if open_dimension != dimension {
                vec![Transition::Travel { dimension }]
            } else {
                vec![]
            }
        }
    };
    pending.0.extend(transitions.into_iter().map(|transition| (next_order(), transition)));
}
