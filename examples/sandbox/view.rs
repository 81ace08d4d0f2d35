//! What the window draws, handed over by the lifecycle's `tick`: the player, and snapshots of the chunks the window
//! asked for or that changed. (A system of the game's can also reach the visit's state itself, with the
//! `VisitSession` system parameter; the sandbox keeps its few uses of it in `tick`, in one place.) Exists only when the
//! sandbox runs with `--window`; the headless sandbox never inserts it, so `tick` skips all of this.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy_agent_tools::VisitId;

use crate::world::{ChunkBlocks, ChunkKey, Dimension, Pos, WorldState};

/// How many chunks the window may ask for in one frame (a new chunk costs a snapshot and a mesh).
pub const NEW_CHUNKS_PER_FRAME: usize = 6;

/// The window's side of the world: what it asks for, and what `tick` answered.
#[derive(Resource, Default)]
pub struct WorldView {
    /// The visit and dimension the rest describes; `None` when no world is shown.
    pub shown: Option<(VisitId, Dimension)>,
    /// Where the player stands.
    pub player: Option<Pos>,
    /// Chunks the window wants drawn, nearest first (set by the window).
    pub wanted: Vec<ChunkKey>,
    /// Chunks the window has drawn (set by the window): when one of them changes, it is sent again.
    pub drawn: HashSet<ChunkKey>,
    /// Fresh snapshots for the window to mesh (filled by `tick`, taken by the window).
    pub snapshots: Vec<ChunkBlocks>,
    /// One step the player asked to walk (x, z), applied by the next `tick`.
    pub walk: Option<(i32, i32)>,
    /// How long each snapshot took (read by the window's `frames`).
    pub snapshot_times: Vec<Duration>,
}

/// The most times kept between two `frames` commands (at 60 frames a second, about half an hour of frames): the
/// oldest half goes when a window is left running without anyone asking.
pub const TIMES_KEPT: usize = 100_000;

/// Adds `time` to `times`, within [`TIMES_KEPT`].
pub fn record_time(times: &mut Vec<Duration>, time: Duration) {
    if times.len() >= TIMES_KEPT {
        times.drain(..TIMES_KEPT / 2);
    }
    times.push(time);
}

impl WorldView {
    /// Called by `tick` each frame while the world is loaded.
    pub fn feed(&mut self, visit: VisitId, dimension: Dimension, state: &mut WorldState) {
        if self.shown != Some((visit, dimension)) {
            // Another visit or dimension: the window starts over (it drops what it drew when it sees this).
            self.shown = Some((visit, dimension));
            self.drawn.clear();
            self.wanted.clear();
            self.snapshots.clear();
        }
        if let Some((dx, dz)) = self.walk.take() {
            state.walk(dimension, dx, dz);
        }
        self.player = Some(state.player(dimension));
        // Every change to a drawn chunk is sent at once: an agent's block shows in the frame after its step.
        for key in state.take_dirty() {
            if key.dimension == dimension && self.drawn.contains(&key) {
                self.snapshot(state, key);
            }
        }
        let wanted: Vec<ChunkKey> = self.wanted.drain(..).take(NEW_CHUNKS_PER_FRAME).collect();
        for key in wanted.into_iter().filter(|key| key.dimension == dimension) {
            self.snapshot(state, key);
            self.drawn.insert(key);
        }
    }

    fn snapshot(&mut self, state: &WorldState, key: ChunkKey) {
        let started = Instant::now();
        self.snapshots.push(state.chunk_blocks(key));
        record_time(&mut self.snapshot_times, started.elapsed());
    }

    /// Called when the visit closes: nothing is shown until the next one feeds.
    pub fn clear(&mut self) {
        *self = Self { snapshot_times: std::mem::take(&mut self.snapshot_times), ..Self::default() };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::world::{Palette, CHUNK};

    fn world() -> WorldState {
        let palette = Palette::parse(include_str!("../../assets/palette.json")).expect("the palette");
        WorldState::generate("alpha", Arc::new(palette))
    }

    #[test]
    fn times_left_unread_stay_within_their_bound_and_the_newest_are_kept() {
        let mut times = Vec::new();
        for n in 0..TIMES_KEPT as u64 * 3 {
            record_time(&mut times, Duration::from_nanos(n));
        }
        assert!(times.len() <= TIMES_KEPT, "{}", times.len());
        assert_eq!(times.last(), Some(&Duration::from_nanos(TIMES_KEPT as u64 * 3 - 1)));
        assert!(times.windows(2).all(|pair| pair[0] < pair[1]), "in order");
    }

    #[test]
    fn a_change_to_a_drawn_chunk_is_sent_again_at_the_next_feed_and_an_undrawn_one_is_not() {
        let mut state = world();
        let gold = state.palette().id("gold").expect("gold");
        let mut view = WorldView::default();
        let visit = VisitId(1);
        let here = ChunkKey::of(Dimension::Overworld, 0, 0);
        view.feed(visit, Dimension::Overworld, &mut state);
        view.wanted = vec![here];
        view.feed(visit, Dimension::Overworld, &mut state);
        assert_eq!(view.snapshots.drain(..).map(|s| s.key).collect::<Vec<_>>(), [here], "what the window asked for");

        state.set(Dimension::Overworld, Pos { x: 3, y: 100, z: 3 }, gold);
        state.set(Dimension::Overworld, Pos { x: 100, y: 100, z: 100 }, gold);
        view.feed(visit, Dimension::Overworld, &mut state);
        let sent: Vec<ChunkBlocks> = view.snapshots.drain(..).collect();
        assert_eq!(sent.iter().map(|s| s.key).collect::<Vec<_>>(), [here], "only the drawn chunk is sent again");
        assert_eq!(sent[0].get(3, 100, 3), gold, "with the new block in it");

        view.feed(visit, Dimension::Overworld, &mut state);
        assert!(view.snapshots.is_empty(), "nothing changed: nothing is sent");
    }

    #[test]
    fn a_block_on_a_chunk_edge_also_changes_the_neighbour_that_shows_it_in_its_ring() {
        let mut state = world();
        let gold = state.palette().id("gold").expect("gold");
        state.take_dirty();
        state.set(Dimension::Overworld, Pos { x: CHUNK - 1, y: 100, z: 5 }, gold);
        let mut dirty = state.take_dirty();
        dirty.sort();
        let east = ChunkKey { dimension: Dimension::Overworld, cx: 1, cz: 0 };
        assert!(dirty.contains(&ChunkKey::of(Dimension::Overworld, 0, 0)) && dirty.contains(&east), "{dirty:?}");
        let neighbour = state.chunk_blocks(east);
        assert_eq!(neighbour.get(-1, 100, 5), gold, "the neighbour's ring holds the block");
    }
}
