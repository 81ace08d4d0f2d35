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
/// the transitions that make them agree.
pub(crate) fn follow_state<S: States>(
    state: Res<State<S>>,
    target: Res<StateTarget<S>>,
    mut pending: ResMut<PendingTransitions>,
) {
    if !state.is_changed() {
        return;
    }
    let wanted = (target.map)(state.get());
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
