//! The world store through the host: completion without a tick (H6), overlapping visits (H7), a clean shutdown,
//! failing saves, damaged saves falling back to the previous one, and the codecs: postcard under the same
//! envelope rules as JSON, switching codecs, and saves written before codecs existed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bevy::app::AppExit;
use bevy::ecs::message::Messages;
use bevy::prelude::*;
use bevy_agent_tools::persist::{Codec, Loaded, WorldStore, WorldStorePlugin};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{AgentRuntime, AgentToolsExitSystems, NoArgs, VisitClosed, VisitSaved, WorldId};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

/// What a visit saves: how many times tools bumped it, over all visits of the world.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
struct Progress {
    count: u64,
}

struct Session {
    world: WorldId,
    progress: Loaded<Progress>,
}

/// A tiny game: `open` loads the world's progress in the background, `close` saves it through the store.
#[derive(Default)]
struct Saves {
    /// Holds serializing the snapshot until released: the save is then still serializing, not yet in its I/O,
    /// when the next visit's load is called.
    held_snapshot: Option<Hold>,
    shutdowns: Arc<AtomicUsize>,
    /// Runs inside `shutdown`, to record what was true at that moment.
    at_shutdown: Option<Box<dyn Fn() + Send + Sync>>,
}

impl WorldLifecycle for Saves {
    type Session = Session;

    fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<Session>, OpenError> {
        let store = world.resource::<WorldStore>();
        let (progress, ready) = store.load_in_background(&visit.world, "progress", Progress::default);
        Ok(Opened::loading(Session { world: visit.world.clone(), progress }, ready))
    }

    fn close(&self, session: Session, world: &mut World) -> Completion {
        let Some(progress) = session.progress.take() else {
            return Completion::failed(format!("world `{}` closed before it finished loading", session.world));
        };
        let store = world.resource::<WorldStore>();
        match &self.held_snapshot {
            Some(hold) => store.save(&session.world, "progress", HeldSnapshot(progress, hold.clone())),
            None => store.save(&session.world, "progress", progress),
        }
    }

    fn shutdown(&self) -> Completion {
        if let Some(at_shutdown) = &self.at_shutdown {
            at_shutdown();
        }
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        Completion::done()
    }
}

/// A snapshot whose serialization (on the store's thread) waits for its hold to be released.
struct HeldSnapshot(Progress, Hold);

impl Serialize for HeldSnapshot {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.1.pass("snapshot");
        self.0.serialize(serializer)
    }
}

/// Holds the store threads that pass it (a write, a snapshot's serialization) until released, each at most
/// [`DEADLINE`], and says who arrived: a save is in flight for exactly as long as a test wants.
#[derive(Clone, Default)]
struct Hold(Arc<(Mutex<Held>, Condvar)>);

#[derive(Default)]
struct Held {
    arrived: Vec<String>,
    released: bool,
}

impl Hold {
    /// Counts `who` in, then waits for the release. Its own deadline (against a test that forgets to release) is
    /// far past [`arrivals`](Self::arrivals)'s: a held writer never lets the next one in before a test waiting
    /// for both has given up (so a test that saves in line fails, rather than seeing both arrive one by one).
    fn pass(&self, who: &str) {
        let (held, changed) = &*self.0;
        let mut held = held.lock();
        held.arrived.push(who.to_owned());
        changed.notify_all();
        let deadline = Instant::now() + DEADLINE * 6;
        while !held.released && !changed.wait_until(&mut held, deadline).timed_out() {}
    }

    /// Who arrived, once `count` did (or [`DEADLINE`] passed), in order.
    fn arrivals(&self, count: usize) -> Vec<String> {
        let (held, changed) = &*self.0;
        let mut held = held.lock();
        let deadline = Instant::now() + DEADLINE;
        while held.arrived.len() < count && !changed.wait_until(&mut held, deadline).timed_out() {}
        held.arrived.clone()
    }

    /// Counts `who` in without waiting.
    fn note(&self, who: &str) {
        let (held, changed) = &*self.0;
        held.lock().arrived.push(who.to_owned());
        changed.notify_all();
    }

    /// Who arrived, once `count` did or `within` passed: what has *not* happened can only be shown over a time.
    fn arrivals_within(&self, count: usize, within: Duration) -> Vec<String> {
        let (held, changed) = &*self.0;
        let mut held = held.lock();
        let deadline = Instant::now() + within;
        while held.arrived.len() < count && !changed.wait_until(&mut held, deadline).timed_out() {}
        held.arrived.clone()
    }

    fn release(&self) {
        let (held, changed) = &*self.0;
        held.lock().released = true;
        changed.notify_all();
    }
}

fn game(saves: Saves, data: &Path) -> App {
    game_with(saves, WorldStorePlugin::new(data))
}

fn game_with(saves: Saves, store: WorldStorePlugin) -> App {
    let bump = AgentTool::new("bump", "Adds one to the progress.", |ctx: CallContext<Session>, _: NoArgs| async move {
        ctx.on_client(|_, session| {
            let progress = session.progress.get_mut().expect("a tool step runs only once the session loaded");
            progress.count += 1;
            progress.count
        })
        .await
    });
    let read = AgentTool::new("read", "Reads the progress.", |ctx: CallContext<Session>, _: NoArgs| async move {
        ctx.on_client(|_, session| session.progress.get().map(|p| p.count)).await
    });
    let mut app = App::new();
    app.add_plugins(MinimalPlugins)
        .add_plugins(AgentToolsPlugin::new(saves).with_tool(bump).with_tool(read))
        .add_plugins(store);
    app.finish();
    app.cleanup();
    app
}

fn call(app: &mut App, tool: &str) -> serde_json::Value {
    let call = app.agent().conversation("test").call(tool, json!({}));
    app.run_until_resolved(&call).unwrap_or_else(|e| panic!("{tool} failed: {e:?}")).value
}

fn store(app: &App) -> WorldStore {
    app.world().resource::<WorldStore>().clone()
}

fn last_close(app: &mut App) -> Completion {
    let closed: Vec<VisitClosed> = app.world_mut().resource_mut::<Messages<VisitClosed>>().drain().collect();
    closed.last().expect("a visit closed").completion.clone()
}

fn on_disk(app: &App, world: &str) -> String {
    let path = store(app).document_path(&WorldId::new(world), "progress").expect("valid names");
    std::fs::read_to_string(&path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()))
}

/// Holds every write (in the store's I/O thread, before the commit) until the returned hold is released.
fn held_writes(store: &WorldStore) -> Hold {
    let hold = Hold::default();
    let passing = hold.clone();
    store.set_write_faults(move |world: &WorldId, _: &str| {
        passing.pass(world.as_str());
        Ok(())
    });
    hold
}

#[test]
fn h6_completion_resolves_without_another_frame_and_the_file_has_the_new_content() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(1));
    assert_eq!(call(&mut app, "bump"), json!(2));

    // The save's write is held until after the exit's last frame: were its completion to need a later system of
    // that frame (or any frame), it could not resolve.
    let hold = held_writes(&store(&app));
    app.exit_world();
    let completion = last_close(&mut app);
    assert!(!completion.is_done(), "the write is held");
    assert_eq!(hold.arrivals(1), ["alpha"], "the save is writing");
    // From here on, no app.update(): nothing on the save path may wait for the main thread.
    hold.release();
    assert_eq!(completion.wait_timeout(DEADLINE), Some(Ok(())), "the save resolves with no further frame");
    assert!(on_disk(&app, "alpha").ends_with(r#"{"count":2}"#), "durable content: {}", on_disk(&app, "alpha"));
}

#[cfg(unix)]
#[test]
fn a_save_that_came_world_writable_is_replaced_by_one_only_its_owner_may_write() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    app.enter_world("alpha");
    call(&mut app, "bump");
    app.exit_world();
    assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())));
    let path = store(&app).document_path(&WorldId::new("alpha"), "progress").expect("valid names");
    // As a save pack shared between players may bring it.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");

    app.enter_world("alpha");
    call(&mut app, "bump");
    app.exit_world();
    assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())));
    let mode = |path: &std::path::Path| std::fs::metadata(path).expect("saved").permissions().mode() & 0o777;
    assert_eq!(mode(&path) & 0o022, 0, "no other user may rewrite the world: {:o}", mode(&path));
    // The save it replaced is kept as the previous one, loaded if the next is damaged: not rewritable either.
    let previous = path.with_extension("json.prev");
    assert_eq!(mode(&previous) & 0o022, 0, "nor its previous save: {:o}", mode(&previous));
    assert!(on_disk(&app, "alpha").ends_with(r#"{"count":2}"#), "{}", on_disk(&app, "alpha"));
}

#[test]
fn h7_reentering_a_world_while_its_save_is_in_flight_loads_what_the_previous_visit_saved() {
    let data = tempfile::tempdir().unwrap();
    let hold = Hold::default();
    let mut app = game(Saves { held_snapshot: Some(hold.clone()), ..Default::default() }, data.path());
    app.enter_world("alpha");
    for _ in 0..3 {
        call(&mut app, "bump");
    }

    app.exit_world();
    let save = last_close(&mut app);
    app.enter_world("alpha");
    assert!(!save.is_done(), "the next visit opened while the previous one was still saving");
    assert_eq!(hold.arrivals(1), ["snapshot"], "the save is serializing its snapshot");
    hold.release();

    assert_eq!(call(&mut app, "read"), json!(3), "the load waited for the in-flight save");
    // (The close completion resolves once the store has also counted the visit out: a moment after the write.)
    assert_eq!(save.wait_timeout(DEADLINE), Some(Ok(())));
    assert_eq!(call(&mut app, "bump"), json!(4), "the new visit has its own state, carried on from the save");
}

/// Another game process on the same data folder (here: another store, which locks as another process would).
struct Neighbour {
    data: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
}

impl Neighbour {
    /// Saves `Progress { count }` as world `world`'s `progress`, through a store of its own.
    fn saves(&self, world: &WorldId, count: u64) -> Option<bevy_agent_tools::CompletionResult> {
        let store = WorldStore::new(self.data.path(), self.runtime.handle().clone());
        store.save(world, "progress", Progress { count }).wait_timeout(DEADLINE)
    }
}

/// A game over a new data folder, and a [`Neighbour`] on the same folder.
fn game_beside_another() -> (App, Neighbour) {
    let data = tempfile::tempdir().unwrap();
    let app = game(Saves::default(), data.path());
    (app, Neighbour { data, runtime: tokio::runtime::Runtime::new().unwrap() })
}

#[test]
fn a_world_left_and_saved_is_let_go_by_the_store_and_locked_again_when_entered() {
    let (mut app, neighbour) = game_beside_another();
    let alpha = WorldId::new("alpha");
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(1));
    let refused = neighbour.saves(&alpha, 7);
    assert!(refused.is_some_and(|saved| saved.is_err()), "in use while its visit is open");

    app.exit_world();
    // No frame after the close: its completion resolves once the world is let go (rule H6).
    assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())), "saved");
    assert_eq!(neighbour.saves(&alpha, 7), Some(Ok(())));
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "read"), json!(7), "loaded again, with what the other wrote");
    let refused = neighbour.saves(&alpha, 9);
    assert!(refused.is_some_and(|saved| saved.is_err()), "locked again by the new visit");
}

#[test]
fn a_world_a_menu_reads_before_any_visit_is_let_go_once_read() {
    // The main menu reads a world to show it, before the player entered any: the world is not kept locked for the
    // rest of the run (another game process, a save-sync tool may use it).
    let (mut app, neighbour) = game_beside_another();
    let beta = WorldId::new("beta");
    assert_eq!(neighbour.saves(&beta, 5), Some(Ok(())));
    let shown: Option<Progress> = app.run_future(store(&app).load(&beta, "progress")).expect("read");
    assert_eq!(shown.map(|progress| progress.count), Some(5));
    assert_eq!(store(&app).flush().wait_timeout(DEADLINE), Some(Ok(())));
    assert_eq!(neighbour.saves(&beta, 7), Some(Ok(())), "let go once read");
}

#[test]
fn a_world_left_while_its_store_is_busy_is_let_go_once_the_store_is_done_with_it() {
    let (mut app, neighbour) = game_beside_another();
    let alpha = WorldId::new("alpha");
    // The game's own save of alpha (an autosave, a menu's), in flight across the whole visit.
    let hold = Hold::default();
    let pinned = store(&app).save(&alpha, "pin", HeldSnapshot(Progress::default(), hold.clone()));
    assert_eq!(hold.arrivals(1), ["snapshot"]);
    app.enter_world("alpha");
    app.exit_world();
    // Its close resolves at once (it never loaded: the load waits behind the pin), while the store is busy.
    assert!(last_close(&mut app).wait_timeout(DEADLINE).is_some_and(|closed| closed.is_err()));
    hold.release();
    assert_eq!(pinned.wait_timeout(DEADLINE), Some(Ok(())));
    // Then the visit's load, the last of alpha's operations: the world is let go before it resolves.
    assert_eq!(store(&app).flush().wait_timeout(DEADLINE), Some(Ok(())));
    let theirs = neighbour.saves(&alpha, 7);
    assert_eq!(theirs, Some(Ok(())), "another game may use the world this one left");
}

/// A snapshot whose serialization panics, as a game's hand-written `Serialize` might.
struct Panicking;

impl Serialize for Panicking {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("a game's Serialize panicked");
    }
}

#[test]
fn a_world_left_is_let_go_again_after_the_games_own_operations_on_it_even_one_that_panicked() {
    let (mut app, neighbour) = game_beside_another();
    let alpha = WorldId::new("alpha");
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(1));
    app.exit_world();
    assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())));
    // The game's menu reads the world it left, then a save of its own panics.
    let read = neighbour.runtime.block_on(store(&app).load::<Progress>(&alpha, "progress"));
    assert_eq!(read.expect("read"), Some(Progress { count: 1 }));
    let failed = store(&app).save(&alpha, "boom", Panicking).wait_timeout(DEADLINE);
    assert!(failed.is_some_and(|saved| saved.is_err()), "the panic is the save's error");
    let theirs = neighbour.saves(&alpha, 7);
    assert_eq!(theirs, Some(Ok(())), "another game may use the world: nothing of this one holds it");
}

#[test]
fn h7_two_worlds_saving_at_once_do_not_wait_for_each_other() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store = WorldStore::new(data.path(), runtime.handle().clone());
    let hold = held_writes(&store);

    let east = store.save(&WorldId::new("east"), "progress", Progress { count: 1 });
    let west = store.save(&WorldId::new("west"), "progress", Progress { count: 1 });
    // Saves of one world would wait in line: the second write could not start while the first is held.
    let mut writing = hold.arrivals(2);
    writing.sort();
    assert_eq!(writing, ["east", "west"], "both worlds were writing at once: neither waited for the other");
    hold.release();
    Completion::all([east, west]).wait_timeout(DEADLINE).expect("both resolve").unwrap();
}

#[test]
fn shutdown_on_app_exit_waits_for_both_saves_then_calls_shutdown_once() {
    let data = tempfile::tempdir().unwrap();
    let in_flight: Arc<Mutex<Vec<Completion>>> = Arc::default();
    let seen_at_shutdown: Arc<Mutex<Vec<String>>> = Arc::default();
    let saves = {
        let (in_flight, seen, root) = (in_flight.clone(), seen_at_shutdown.clone(), data.path().to_path_buf());
        Saves {
            at_shutdown: Some(Box::new(move || {
                let durable = in_flight.lock().iter().all(|c| c.result() == Some(Ok(())));
                let files: Vec<_> = ["alpha", "beta"].iter().map(|w| read_progress(&root, w)).collect();
                seen.lock().push(format!("durable={durable} files={files:?}"));
            })),
            ..Default::default()
        }
    };
    let shutdowns = saves.shutdowns.clone();
    let mut app = game(saves, data.path());
    let hold = held_writes(&store(&app));
    for world in ["alpha", "beta"] {
        app.enter_world(world);
        call(&mut app, "bump");
        app.exit_world();
        in_flight.lock().push(last_close(&mut app));
    }
    assert!(in_flight.lock().iter().all(|c| !c.is_done()), "both saves are in flight at AppExit");

    // The saves are held while the exit runs: for a second from the exit frame's start (far below the exit's own
    // 30 s bound), then released. Shutdown must not run before that.
    let releasing = release_once_the_exit_begins(&mut app, hold, Duration::from_secs(1));
    app.world_mut().write_message(AppExit::Success);
    app.update();
    releasing.joined();

    assert_eq!(
        *seen_at_shutdown.lock(),
        vec![r#"durable=true files=["{\"count\":1}", "{\"count\":1}"]"#.to_string()],
        "shutdown ran once, after both saves were durable"
    );
    app.update();
    assert_eq!(shutdowns.load(Ordering::SeqCst), 1, "shutdown is called exactly once");
}

#[test]
fn h6_app_exit_waits_for_a_save_the_game_started_itself() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    let store = store(&app);
    let hold = held_writes(&store);
    // An autosave of the game's own, not a visit's close: still writing when the player quits.
    let autosave = store.save(&WorldId::new("alpha"), "autosave", Progress { count: 7 });
    assert_eq!(hold.arrivals(1), ["alpha"], "the autosave is writing");
    // Held past the second the runtime gives its tasks when it stops (a slow disk), far below the exit's 30 s.
    let releasing = release_once_the_exit_begins(&mut app, hold, Duration::from_millis(1500));
    app.world_mut().write_message(AppExit::Success);
    app.update();
    assert_eq!(autosave.result(), Some(Ok(())), "the exit waited for the autosave");
    let path = store.document_path(&WorldId::new("alpha"), "autosave").expect("valid names");
    let saved = std::fs::read_to_string(&path).expect("the autosave is on disk");
    assert!(saved.ends_with(r#"{"count":7}"#), "{saved}");
    releasing.joined();
}

/// Releases a hold `after` a while, counted from the exit frame, just before the host's exit (not from the test's
/// own thread, which a loaded machine may keep waiting long enough for the saves to end before the exit begins,
/// when an exit that does not wait for them would pass too).
#[derive(Resource, Clone)]
struct Releasing(Arc<Mutex<Release>>);

#[derive(Default)]
struct Release {
    /// What to release and after how long, until the exit frame starts it.
    waiting: Option<(Hold, Duration)>,
    started: Option<std::thread::JoinHandle<()>>,
}

impl Releasing {
    fn joined(&self) {
        let started = self.0.lock().started.take().expect("the exit frame started the release");
        started.join().expect("released");
    }
}

fn release_once_the_exit_begins(app: &mut App, hold: Hold, after: Duration) -> Releasing {
    let releasing = Releasing(Arc::new(Mutex::new(Release { waiting: Some((hold, after)), started: None })));
    fn start(releasing: Res<Releasing>) {
        let mut releasing = releasing.0.lock();
        if let Some((hold, after)) = releasing.waiting.take() {
            releasing.started = Some(std::thread::spawn(move || {
                std::thread::sleep(after);
                hold.release();
            }));
        }
    }
    app.insert_resource(releasing.clone()).add_systems(Last, start.before(AgentToolsExitSystems::Host));
    releasing
}

/// What a system after `AgentToolsExitSystems::Host` read on the exit's frame.
#[derive(Resource, Default)]
struct ReadAfterExit(Vec<String>);

fn read_after_exit(
    mut closed: MessageReader<VisitClosed>,
    mut saved: MessageReader<VisitSaved>,
    mut read: ResMut<ReadAfterExit>,
) {
    read.0.extend(closed.read().map(|m| format!("closed {}", m.info.world)));
    read.0.extend(saved.read().map(|m| format!("saved {} {:?}", m.info.world, m.result)));
}

#[test]
fn h6_the_exits_close_and_save_reach_a_system_after_exit_set_host() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    app.init_resource::<ReadAfterExit>().add_systems(Last, read_after_exit.after(AgentToolsExitSystems::Host));
    app.enter_world("alpha");
    call(&mut app, "bump");
    app.world_mut().write_message(AppExit::Success);
    app.update();
    assert_eq!(
        app.world().resource::<ReadAfterExit>().0,
        ["closed alpha", "saved alpha Ok(())"],
        "the exit's frame is the app's last: its save is reported in it"
    );
    assert_eq!(read_progress(data.path(), "alpha"), r#"{"count":1}"#);
}

/// Writes `AppExit` from `Last`, after every exit step ran there, once `Quit` is present.
#[derive(Resource)]
struct Quit;

fn quit_late(quit: Option<Res<Quit>>, mut exit: MessageWriter<AppExit>) {
    if quit.is_some() {
        exit.write(AppExit::Success);
    }
}

#[test]
fn h6_an_app_exit_written_in_last_after_the_exit_sets_still_closes_and_saves_the_visit_in_that_frame() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    app.add_systems(Last, quit_late.after(AgentToolsExitSystems::Transport));
    app.enter_world("alpha");
    call(&mut app, "bump");
    app.insert_resource(Quit);
    app.update();
    assert!(app.should_exit().is_some(), "the runner would stop after this frame");
    assert_eq!(read_progress(data.path(), "alpha"), r#"{"count":1}"#, "the visit was saved before it");
}

#[test]
fn h6_an_app_exit_written_after_the_frames_schedules_is_closed_and_saved_by_run_pending_exit() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    app.enter_world("alpha");
    call(&mut app, "bump");
    assert!(!bevy_agent_tools::run_pending_exit(app.world_mut()), "no AppExit is pending: there is no exit to run");
    // As Bevy's renderer writes one on a GPU error: after the frame's schedules, and the runner stops next.
    app.world_mut().write_message(AppExit::error());
    assert!(bevy_agent_tools::run_pending_exit(app.world_mut()), "the exit ran");
    assert_eq!(read_progress(data.path(), "alpha"), r#"{"count":1}"#, "the visit was saved before the runner stops");
    assert!(app.world().resource::<AgentRuntime>().is_stopped(), "the whole exit ran, to the runtime's stop");
    assert!(!bevy_agent_tools::run_pending_exit(app.world_mut()), "the exit runs once");
    assert!(app.should_exit().is_some(), "and the AppExit is left for the runner");
}

fn read_progress(root: &Path, world: &str) -> String {
    let text = std::fs::read_to_string(root.join(world).join("progress.json")).unwrap_or_default();
    text.lines().nth(1).unwrap_or("<missing>").to_string()
}

#[test]
fn failed_save_is_reported_the_game_keeps_running_and_the_previous_save_loads() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    let failing = Arc::new(AtomicBool::new(false));
    let injected = failing.clone();
    store(&app).set_write_faults(move |_: &WorldId, _: &str| {
        if injected.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected: disk full"));
        }
        Ok(())
    });
    app.enter_world("alpha");
    call(&mut app, "bump");
    app.exit_world();
    last_close(&mut app).wait_timeout(DEADLINE).expect("first save resolves").expect("first save succeeds");

    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(2));
    failing.store(true, Ordering::SeqCst);
    app.exit_world();
    let error = last_close(&mut app).wait_timeout(DEADLINE).expect("the failed save resolves").unwrap_err();
    assert!(error.message().contains("injected: disk full"), "the completion carries the error: {error}");
    assert!(error.message().contains("alpha"), "and names the world: {error}");

    let mut reported = Vec::new();
    app.run_until("VisitSaved reports the failure", |app| {
        reported.extend(app.world_mut().resource_mut::<Messages<VisitSaved>>().drain());
        reported.iter().any(|saved| saved.result.is_err())
    });
    let failure = reported.iter().find(|saved| saved.result.is_err()).expect("a failure was reported");
    assert_eq!(failure.info.world, WorldId::new("alpha"));

    failing.store(false, Ordering::SeqCst);
    assert!(on_disk(&app, "alpha").ends_with(r#"{"count":1}"#), "the previous save is intact");
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "read"), json!(1), "the game keeps running and the previous save loads");
}

/// Collects `WARN` events from every thread (the store warns on its I/O threads).
fn warnings() -> &'static Mutex<Vec<String>> {
    use tracing_subscriber::layer::SubscriberExt;
    static WARNINGS: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();
    WARNINGS.get_or_init(|| {
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(WarnLayer(warnings.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber in this test binary");
        warnings
    })
}

struct WarnLayer(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarnLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().push(fields.0);
        }
    }
}

fn damage(path: &PathBuf, how: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    match how {
        "torn" => bytes.truncate(bytes.len() / 2),
        _ => {
            let last = bytes.len() - 3;
            bytes[last] ^= 0x20;
        }
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn damaged_save_falls_back_to_the_previous_one_with_a_warning() {
    let warnings = warnings();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store = WorldStore::new(data.path(), runtime.handle().clone());
    let load = |world: &WorldId| runtime.block_on(store.load::<Progress>(world, "progress"));

    for (world, how) in [("torn", "torn"), ("flipped", "flip")] {
        let world = WorldId::new(world);
        let path = store.document_path(&world, "progress").unwrap();
        store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
        store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
        damage(&path, how);

        assert_eq!(load(&world).unwrap(), Some(Progress { count: 1 }), "{how}: falls back to the previous save");
        assert!(
            warnings.lock().iter().any(|w| w.contains(&format!("world={world}")) && w.contains("previous save")),
            "{how}: a warning names the world: {:?}",
            warnings.lock()
        );

        // The damaged primary is never rotated in as the previous save.
        store.save(&world, "progress", Progress { count: 3 }).wait().unwrap();
        assert_eq!(load(&world).unwrap(), Some(Progress { count: 3 }));
        damage(&path, how);
        assert_eq!(load(&world).unwrap(), Some(Progress { count: 1 }), "{how}: the last good save survives");
    }
}

#[test]
fn a_folder_where_a_save_goes_is_moved_aside_and_a_failed_commit_leaves_no_temporary_file() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store = WorldStore::new(data.path(), runtime.handle().clone());
    let world = WorldId::new("unreadable");
    store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
    // A folder in the primary's place (a person's, a sync tool's): it cannot be read, so the previous save loads.
    let path = store.document_path(&world, "progress").unwrap();
    let dir = path.parent().unwrap().to_path_buf();
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("notes.txt"), "mine").unwrap();
    let load = |store: &WorldStore| runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap();
    assert_eq!(load(&store), Some(Progress { count: 1 }), "falls back to the previous save");

    // No file can be renamed over a folder: the next save moves it aside, contents and all, and takes its place.
    store.save(&world, "progress", Progress { count: 3 }).wait().unwrap();
    assert_eq!(load(&store), Some(Progress { count: 3 }));
    let kept = std::fs::read_to_string(dir.join("progress.json.unreadable-1/notes.txt"));
    assert_eq!(kept.unwrap(), "mine", "the folder is kept aside");
    // The same for a folder where the previous save goes.
    let previous = dir.join("progress.json.prev");
    std::fs::remove_file(&previous).unwrap();
    std::fs::create_dir(&previous).unwrap();
    store.save(&world, "progress", Progress { count: 4 }).wait().unwrap();
    assert!(dir.join("progress.json.prev.unreadable-1").is_dir());
    assert!(std::fs::read_to_string(&previous).unwrap().ends_with(r#"{"count":3}"#), "the save it replaced");

    // A commit that fails (here its rename: the temporary file is moved away first) leaves no temporary file to
    // fill the disk, and the save before it loads.
    let moving = dir.clone();
    store.set_write_faults(move |_: &WorldId, _: &str| {
        for entry in std::fs::read_dir(&moving)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(".progress.json") && !name.contains("superseded") && !name.contains("moved") {
                std::fs::rename(entry.path(), moving.join(".progress.json.moved"))?;
            }
        }
        Ok(())
    });
    let error = store.save(&world, "progress", Progress { count: 5 }).wait().unwrap_err();
    assert!(error.message().contains("committing"), "{error}");
    store.flush().wait().unwrap();
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "no temporary file left: {left:?}");
    assert_eq!(load(&store), Some(Progress { count: 4 }), "the last save is kept");
}

/// Fails the next `left` reads of a primary save with the disk's `EIO`, as a network file system's passing failure
/// (or, for ever, a bad sector) does.
#[cfg(unix)]
struct ReadsFail(AtomicUsize);

#[cfg(unix)]
impl bevy_agent_tools::persist::WriteFaults for ReadsFail {
    fn before_commit(&self, _: &WorldId, _: &str) -> std::io::Result<()> {
        Ok(())
    }

    fn before_read(&self, _: &WorldId, _: &str) -> std::io::Result<()> {
        match self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)) {
            Ok(_) => Err(std::io::Error::from_raw_os_error(5)),
            Err(_) => Ok(()),
        }
    }
}

/// Holds the freeing of each save two saves old until released, and notes every read of a save (`read`).
struct FreeingHeld(Hold);

impl bevy_agent_tools::persist::WriteFaults for FreeingHeld {
    fn before_commit(&self, _: &WorldId, _: &str) -> std::io::Result<()> {
        Ok(())
    }

    fn before_freeing(&self, _: &WorldId, document: &str) -> std::io::Result<()> {
        self.0.pass(document);
        Ok(())
    }

    fn before_read(&self, _: &WorldId, _: &str) -> std::io::Result<()> {
        self.0.note("read");
        Ok(())
    }
}

/// How long a test watches for a read that must not come yet: a load takes well under a millisecond here.
const NOT_YET: Duration = Duration::from_millis(300);

struct ReleasedOnDrop(Hold);

impl Drop for ReleasedOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// The files in `world`'s folder, sorted, with what each ends with (a save's payload is its end).
fn folder(store: &WorldStore, world: &WorldId) -> Vec<(String, String)> {
    let mut files: Vec<_> = std::fs::read_dir(store.world_dir(world).unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().is_some_and(|name| name != "world.lock"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let end = text.rsplit('\n').next().unwrap_or_default().to_string();
            (path.file_name().unwrap().to_string_lossy().into_owned(), end)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn h6_a_save_is_durable_and_reported_before_the_save_two_saves_ago_is_freed_which_the_next_operation_waits_for() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("rotating");
    for count in [1, 2] {
        store.save(&world, "progress", Progress { count }).wait().unwrap();
    }
    let hold = Hold::default();
    store.set_write_faults(FreeingHeld(hold.clone()));
    // Released on a failed assertion too, before the runtime's drop waits for the held thread.
    let _released = ReleasedOnDrop(hold.clone());
    let third = store.save(&world, "progress", Progress { count: 3 });
    assert_eq!(hold.arrivals(1), ["progress"], "the save two saves ago is about to be freed");
    let reported = third.wait_timeout(DEADLINE);
    assert!(matches!(reported, Some(Ok(()))), "reported while its freeing is held: {reported:?}");
    let files = folder(&store, &world);
    assert_eq!(files.len(), 3, "the primary, the previous save and the one not yet freed: {files:?}");
    assert_eq!(files[0].1, r#"{"count":1}"#, "the save two saves ago, under a temporary name: {files:?}");
    assert!(files[0].0.starts_with(".progress.json."), "{files:?}");
    let next = runtime.spawn(store.load::<Progress>(&world, "progress"));
    assert_eq!(hold.arrivals_within(2, NOT_YET), ["progress"], "the world's next operation waits for the freeing");
    assert!(!store.flush().is_done(), "a flush waits for the freeing");
    hold.release();
    assert_eq!(runtime.block_on(next).unwrap().unwrap(), Some(Progress { count: 3 }));
    assert_eq!(hold.arrivals(2), ["progress", "read"]);
    store.flush().wait().unwrap();
    let expected = [("progress.json", r#"{"count":3}"#), ("progress.json.prev", r#"{"count":2}"#)];
    let expected: Vec<_> = expected.iter().map(|(name, end)| (name.to_string(), end.to_string())).collect();
    assert_eq!(folder(&store, &world), expected, "freed: nothing else is left");
}

#[test]
fn h7_a_world_let_go_and_entered_again_loads_after_its_last_saves_freeing() {
    // The plugin's store lets a world go once its visit has closed, before the save two saves ago is freed: the next
    // visit's load comes to a new queue of the world, which waits for that freeing as the old one's next operation
    // would.
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    for count in [1, 2] {
        app.enter_world("alpha");
        assert_eq!(call(&mut app, "bump"), json!(count));
        app.exit_world();
        assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())));
    }
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(3));
    let hold = Hold::default();
    store(&app).set_write_faults(FreeingHeld(hold.clone()));
    let _released = ReleasedOnDrop(hold.clone());
    app.exit_world();
    assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())), "saved, and the world let go");
    assert_eq!(hold.arrivals(1), ["progress"], "the save two saves ago is being freed");

    app.enter_world("alpha");
    assert_eq!(hold.arrivals_within(2, NOT_YET), ["progress"], "the load waits for the freeing");
    assert!(!store(&app).flush().is_done(), "a flush waits for the freeing of a world let go");
    hold.release();
    assert_eq!(call(&mut app, "read"), json!(3));
    assert_eq!(hold.arrivals(2), ["progress", "read"]);
}

/// A store whose `world` was saved twice (counts 1 and 2), then whose next `failures` reads of a primary fail.
#[cfg(unix)]
fn saved_twice_then_reads_fail(
    world: &WorldId,
    failures: usize,
) -> (tempfile::TempDir, tokio::runtime::Runtime, WorldStore) {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    store.save(world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(world, "progress", Progress { count: 2 }).wait().unwrap();
    store.set_write_faults(ReadsFail(AtomicUsize::new(failures)));
    (data, runtime, store)
}

/// The first copy of `world`'s primary save kept aside.
#[cfg(unix)]
fn kept_aside(store: &WorldStore, world: &WorldId) -> String {
    let aside = store.world_dir(world).unwrap().join("progress.json.unreadable-1");
    std::fs::read_to_string(aside).expect("a copy kept aside")
}

#[cfg(unix)]
#[test]
fn a_primary_that_fails_to_read_once_is_read_again_not_replaced_by_the_previous_save() {
    let world = WorldId::new("flaky");
    let (_data, runtime, store) = saved_twice_then_reads_fail(&world, 1);
    let loaded = runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap();
    assert_eq!(loaded, Some(Progress { count: 2 }), "the newest save, read again, not the previous one");
}

#[cfg(unix)]
#[test]
fn a_primary_the_disk_cannot_read_is_kept_aside_when_a_save_replaces_it() {
    let world = WorldId::new("bad-sector");
    let (_data, runtime, store) = saved_twice_then_reads_fail(&world, usize::MAX);
    let load = || runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap();
    assert_eq!(load(), Some(Progress { count: 1 }), "unreadable however often it is read: the previous save");
    store.save(&world, "progress", Progress { count: 3 }).wait().unwrap();
    store.clear_write_faults();
    assert_eq!(load(), Some(Progress { count: 3 }));
    assert!(kept_aside(&store, &world).ends_with(r#"{"count":2}"#), "the unreadable save, not overwritten");
}

#[cfg(unix)]
#[test]
fn a_primary_unreadable_at_the_load_is_kept_aside_by_the_next_save_even_if_it_reads_again_by_then() {
    let world = WorldId::new("flaky-mount");
    // Unreadable for the load and its retries; readable again afterwards.
    let (_data, runtime, store) = saved_twice_then_reads_fail(&world, 4);
    let load = || runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap();
    assert_eq!(load(), Some(Progress { count: 1 }), "the previous save, after the retries");
    store.save(&world, "progress", Progress { count: 3 }).wait().unwrap();
    assert_eq!(load(), Some(Progress { count: 3 }));
    assert!(kept_aside(&store, &world).ends_with(r#"{"count":2}"#), "the save the game did not load");
    let previous = std::fs::read_to_string(store.world_dir(&world).unwrap().join("progress.json.prev"));
    let previous = previous.expect("a previous save");
    assert!(
        previous.ends_with(r#"{"count":1}"#),
        "the save the game built on, not the one it never loaded: {previous}"
    );
}

#[cfg(unix)]
#[test]
fn a_primary_a_menu_could_not_read_is_kept_aside_by_a_later_save_though_the_world_was_let_go_between() {
    let (mut app, neighbour) = game_beside_another();
    let alpha = WorldId::new("alpha");
    // Two visits: the store is the host's (it lets a world go once nothing uses it), and alpha has two saves.
    for count in [1, 2] {
        app.enter_world("alpha");
        assert_eq!(call(&mut app, "bump"), json!(count));
        app.exit_world();
        assert_eq!(last_close(&mut app).wait_timeout(DEADLINE), Some(Ok(())));
    }
    let store = store(&app);
    // The menu reads alpha while the disk cannot read its newest save: the previous one. Nothing holds alpha after.
    store.set_write_faults(ReadsFail(AtomicUsize::new(4)));
    let read = neighbour.runtime.block_on(store.load::<Progress>(&alpha, "progress"));
    assert_eq!(read.expect("read"), Some(Progress { count: 1 }));
    store.save(&alpha, "progress", Progress { count: 5 }).wait().unwrap();
    assert!(kept_aside(&store, &alpha).ends_with(r#"{"count":2}"#), "the save the menu could not read");
    let previous = std::fs::read_to_string(store.world_dir(&alpha).unwrap().join("progress.json.prev"));
    let previous = previous.expect("a previous save");
    assert!(previous.ends_with(r#"{"count":1}"#), "{previous}");
}

#[test]
fn damaged_save_and_damaged_previous_is_a_clear_error_not_a_default() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store = WorldStore::new(data.path(), runtime.handle().clone());
    let world = WorldId::new("ruined");
    store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
    let path = store.document_path(&world, "progress").unwrap();
    damage(&path, "torn");
    damage(&path.with_extension("json.prev"), "flip");
    let error = runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("`ruined`") && message.contains("damaged"), "names the world: {message}");
    assert!(message.contains("and so is its previous save (checksum mismatch)"), "says what is wrong: {message}");
}

#[test]
fn world_names_that_could_escape_the_data_directory_fail_clearly() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    let save = store(&app).save(&WorldId::new("../outside"), "progress", Progress::default());
    let error = save.wait_timeout(DEADLINE).expect("resolves at once").unwrap_err();
    assert!(error.message().contains("invalid world name"), "{error}");

    app.enter_world("Bad/Name");
    let call = app.agent().conversation("test").call("read", json!({}));
    let outcome = app.run_until_resolved(&call).unwrap_err();
    assert!(outcome.message.contains("invalid world name"), "the loading session fails with the reason: {outcome:?}");
    assert!(std::fs::read_dir(data.path()).unwrap().next().is_none(), "nothing was created");
}

/// A world's folder from a save pack someone shared may hold links pointing anywhere: the store follows none of
/// them, and what they point to is left as it was.
#[cfg(unix)]
#[test]
fn links_in_a_worlds_folder_are_not_followed_and_what_they_point_to_is_untouched() {
    use std::os::unix::fs::symlink;
    let data = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let precious = outside.path().join("precious.txt");
    std::fs::write(&precious, "precious").unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let load = |world: &WorldId| runtime.block_on(store.load::<Progress>(world, "progress"));

    // The lock file, which the store takes and writes its pid into.
    let world = WorldId::new("linked-lock");
    let folder = store.world_dir(&world).unwrap();
    std::fs::create_dir_all(&folder).unwrap();
    symlink(&precious, folder.join("world.lock")).unwrap();
    let error = store.save(&world, "progress", Progress { count: 1 }).wait().unwrap_err();
    assert!(error.message().contains("lock file") && error.message().contains("not followed"), "{error}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "precious", "the file the link names is unchanged");

    // The world's folder itself.
    let world = WorldId::new("linked-folder");
    symlink(outside.path(), store.world_dir(&world).unwrap()).unwrap();
    let error = store.save(&world, "progress", Progress { count: 1 }).wait().unwrap_err();
    assert!(error.message().contains("not followed"), "{error}");
    let names: Vec<_> = std::fs::read_dir(outside.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["precious.txt"], "nothing was written or removed where the folder's link points");

    // A save: read as damage (the previous save loads, not what the link points to), then replaced, not written
    // through.
    let other = WorldId::new("other");
    store.save(&other, "progress", Progress { count: 99 }).wait().unwrap();
    let world = WorldId::new("linked-save");
    store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
    let primary = store.document_path(&world, "progress").unwrap();
    std::fs::remove_file(&primary).unwrap();
    symlink(store.document_path(&other, "progress").unwrap(), &primary).unwrap();
    assert_eq!(load(&world).unwrap(), Some(Progress { count: 1 }), "the previous save, not the other world's");
    store.save(&world, "progress", Progress { count: 3 }).wait().unwrap();
    assert!(!std::fs::symlink_metadata(&primary).unwrap().file_type().is_symlink(), "the link was replaced");
    assert!(!primary.with_extension("json.unreadable-1").exists(), "not kept aside as a save the disk failed to read");
    assert_eq!(load(&world).unwrap(), Some(Progress { count: 3 }));
    assert_eq!(load(&other).unwrap(), Some(Progress { count: 99 }), "the other world's save is untouched");
}

/// A FIFO in place of a save would block its read, and the world's queue behind it, for good.
#[cfg(unix)]
#[test]
fn a_fifo_in_place_of_a_save_reads_as_damage_and_does_not_block_the_world() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("piped");
    store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
    let primary = store.document_path(&world, "progress").unwrap();
    std::fs::remove_file(&primary).unwrap();
    let name = std::ffi::CString::new(primary.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; `mkfifo` only creates a file.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    let loaded =
        runtime.block_on(async { tokio::time::timeout(DEADLINE, store.load::<Progress>(&world, "progress")).await });
    assert_eq!(loaded.expect("the load does not block").unwrap(), Some(Progress { count: 1 }));
    store.save(&world, "progress", Progress { count: 3 }).wait().unwrap();
    assert!(!primary.with_extension("json.unreadable-1").exists(), "the FIFO is not kept aside");
    assert_eq!(runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap(), Some(Progress { count: 3 }));
}

/// Serializes part of itself, then fails: the serializer's error arrives after bytes were streamed to the file.
struct FailsHalfway;

impl Serialize for FailsHalfway {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut seq = serializer.serialize_seq(None)?;
        for i in 0..100_000u32 {
            seq.serialize_element(&i)?;
        }
        Err(S::Error::custom("this snapshot cannot be encoded"))
    }
}

#[test]
fn a_snapshot_that_fails_to_serialize_midway_is_an_encode_error_and_the_previous_save_stays() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store = WorldStore::new(data.path(), runtime.handle().clone());
    let world = WorldId::new("halfway");
    store.save(&world, "progress", Progress { count: 4 }).wait().unwrap();

    let error = runtime.block_on(store.save_async(&world, "progress", FailsHalfway)).unwrap_err();
    assert!(matches!(error, bevy_agent_tools::StoreError::Encode { .. }), "{error:?}");
    assert!(error.to_string().contains("this snapshot cannot be encoded"), "{error}");
    assert_eq!(runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap(), Some(Progress { count: 4 }));
    let files: Vec<String> = std::fs::read_dir(store.world_dir(&world).unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with('.'))
        .collect();
    assert!(files.is_empty(), "the partly written temporary file was removed: {files:?}");
}

/// A body with a velocity: what a physics step can leave NaN.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Body {
    name: String,
    velocity: [f32; 2],
}

#[test]
fn a_json_save_of_a_nan_or_infinite_float_is_refused_naming_the_field_and_the_previous_save_still_loads() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("drifting");
    let bodies = vec![Body { name: "moth".into(), velocity: [0.5, -1.0] }; 3];
    store.save(&world, "bodies", bodies.clone()).wait().unwrap();
    store.save_records(&world, "records", bodies.clone()).wait().unwrap();

    let mut drifting = bodies.clone();
    drifting[1].velocity[1] = f32::NAN;
    // serde_json alone writes NaN as `null`: the save succeeded, and the world then failed to load.
    let error = runtime.block_on(store.save_async(&world, "bodies", drifting.clone())).unwrap_err();
    assert!(matches!(error, bevy_agent_tools::StoreError::Encode { .. }), "{error:?}");
    assert!(error.to_string().contains("NaN or infinite (at `[1].velocity[1]`)"), "{error}");
    drifting[1].velocity[1] = f32::INFINITY;
    let error = store.save_records(&world, "records", drifting).wait().unwrap_err();
    assert!(error.to_string().contains("(at `[1].velocity[1]`)"), "{error}");

    // Encoded on several threads, the same words.
    let mut many = vec![Body { name: "moth".into(), velocity: [0.5, -1.0] }; 200_000];
    many[123_456].velocity[0] = f32::NAN;
    let error = store.save_records(&world, "records", many).wait().unwrap_err();
    assert!(error.to_string().contains("(at `[123456].velocity[0]`)"), "{error}");

    for document in ["bodies", "records"] {
        let loaded = runtime.block_on(store.load::<Vec<Body>>(&world, document)).unwrap();
        assert_eq!(loaded.as_ref(), Some(&bodies), "{document}: the previous save is still the one that loads");
    }
    // postcard keeps non-finite floats as they are.
    let postcard = store.clone().with_codec(bevy_agent_tools::persist::Codec::Postcard);
    let infinite = vec![Body { name: "far".into(), velocity: [f32::INFINITY, 0.0] }];
    postcard.save(&world, "far", infinite.clone()).wait().unwrap();
    assert_eq!(runtime.block_on(postcard.load::<Vec<Body>>(&world, "far")).unwrap(), Some(infinite));
}

// Codecs.

/// A document with the shapes game state has: many small records, strings, options, nested sequences.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Terrain {
    generation: u32,
    cells: Vec<Cell>,
    name: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Cell {
    x: i32,
    y: i32,
    block: String,
    tags: Vec<u16>,
}

fn terrain(generation: u32) -> Terrain {
    let cells = (0..500)
        .map(|i| Cell {
            x: i - 250,
            y: (i * 7 + generation as i32) % 64,
            block: ["stone", "grass", "water"][i as usize % 3].to_string(),
            tags: vec![generation as u16; (i % 4) as usize],
        })
        .collect();
    Terrain { generation, cells, name: Some(format!("generation {generation}")) }
}

/// The header line of a document's primary file.
fn header(store: &WorldStore, world: &WorldId, document: &str) -> String {
    let bytes = std::fs::read(store.document_path(world, document).expect("valid names")).unwrap_or_default();
    let end = bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn runtime_and_store(data: &Path) -> (tokio::runtime::Runtime, WorldStore) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = WorldStore::new(data, runtime.handle().clone());
    (runtime, store)
}

#[test]
fn postcard_save_round_trips_and_survives_crc_corruption_via_prev() {
    let warnings = warnings();
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let store = store.with_codec(Codec::Postcard);
    let load = |world: &WorldId| runtime.block_on(store.load::<Terrain>(world, "terrain"));

    for (world, how) in [("pc-torn", "torn"), ("pc-flipped", "flip")] {
        let world = WorldId::new(world);
        let path = store.document_path(&world, "terrain").unwrap();
        store.save(&world, "terrain", terrain(1)).wait().unwrap();
        store.save(&world, "terrain", terrain(2)).wait().unwrap();
        assert!(header(&store, &world, "terrain").contains(" codec=postcard "), "the envelope names its codec");
        let size = std::fs::metadata(&path).unwrap().len();
        let json_size = serde_json::to_vec(&terrain(2)).unwrap().len() as u64;
        assert!(size < json_size / 2, "binary: {size} bytes on disk, {json_size} as JSON");
        assert_eq!(load(&world).unwrap(), Some(terrain(2)), "round trip");

        damage(&path, how);
        assert_eq!(load(&world).unwrap(), Some(terrain(1)), "{how}: falls back to the previous save");
        assert!(
            warnings.lock().iter().any(|w| w.contains(&format!("world={world}")) && w.contains("previous save")),
            "{how}: a warning names the world: {:?}",
            warnings.lock()
        );

        // The damaged primary is never rotated in as the previous save.
        store.save(&world, "terrain", terrain(3)).wait().unwrap();
        assert_eq!(load(&world).unwrap(), Some(terrain(3)));
        damage(&path, how);
        assert_eq!(load(&world).unwrap(), Some(terrain(1)), "{how}: the last good save survives");
    }
}

#[test]
fn postcard_save_and_damaged_previous_is_a_clear_error_not_a_default() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let store = store.with_codec(Codec::Postcard);
    let world = WorldId::new("ruined");
    store.save(&world, "terrain", terrain(1)).wait().unwrap();
    store.save(&world, "terrain", terrain(2)).wait().unwrap();
    let path = store.document_path(&world, "terrain").unwrap();
    damage(&path, "torn");
    damage(&path.with_extension("json.prev"), "flip");
    let error = runtime.block_on(store.load::<Terrain>(&world, "terrain")).unwrap_err();
    assert!(matches!(error, bevy_agent_tools::StoreError::Damaged { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("`ruined`") && message.contains("torn"), "names the world and the damage: {message}");
    assert!(message.contains("and so is its previous save (checksum mismatch)"), "says what is wrong: {message}");
}

/// The fixture was written by the store as it was before codecs (commit a9ae0c4, `WorldStore::save` of
/// `Progress { count: 1 }` then `Progress { count: 2 }`): its header has no `codec=`.
fn saves_before_codecs(into: &Path) -> WorldId {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/saves_before_codecs/alpha");
    let world = into.join("alpha");
    std::fs::create_dir_all(&world).unwrap();
    for file in ["progress.json", "progress.json.prev"] {
        std::fs::copy(fixture.join(file), world.join(file)).unwrap();
    }
    WorldId::new("alpha")
}

#[test]
fn json_save_written_before_codecs_still_loads() {
    for codec in [Codec::Json, Codec::Postcard] {
        let data = tempfile::tempdir().unwrap();
        let world = saves_before_codecs(data.path());
        let (runtime, store) = runtime_and_store(data.path());
        let store = store.with_codec(codec);
        assert!(!header(&store, &world, "progress").contains("codec="), "the fixture predates codecs");
        let load = || runtime.block_on(store.load::<Progress>(&world, "progress"));
        assert_eq!(load().unwrap(), Some(Progress { count: 2 }), "a store saving {codec} loads the old JSON save");

        // Its previous save is still a fallback.
        damage(&store.document_path(&world, "progress").unwrap(), "torn");
        assert_eq!(load().unwrap(), Some(Progress { count: 1 }), "{codec}: falls back to the old previous save");
    }
}

#[test]
fn store_switched_from_json_to_postcard_loads_the_json_save_and_falls_back_to_it() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, json) = runtime_and_store(data.path());
    let world = WorldId::new("switched");
    json.save(&world, "terrain", terrain(1)).wait().unwrap();
    assert!(header(&json, &world, "terrain").contains(" codec=json "), "the envelope names JSON too");

    // The game now saves postcard (a handle on the same store: same queue and lock).
    let postcard = json.clone().with_codec(Codec::Postcard);
    let load = || runtime.block_on(postcard.load::<Terrain>(&world, "terrain"));
    assert_eq!(load().unwrap(), Some(terrain(1)), "the JSON save loads under postcard");
    postcard.save(&world, "terrain", terrain(2)).wait().unwrap();
    assert!(header(&postcard, &world, "terrain").contains(" codec=postcard "));
    assert_eq!(load().unwrap(), Some(terrain(2)));

    // The previous save is the JSON one: a damaged postcard primary falls back to it.
    damage(&postcard.document_path(&world, "terrain").unwrap(), "flip");
    assert_eq!(load().unwrap(), Some(terrain(1)), "falls back across codecs");
}

#[test]
fn store_switched_back_from_postcard_to_json_still_loads_postcard_saves() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("back");
    store.clone().with_codec(Codec::Postcard).save(&world, "terrain", terrain(1)).wait().unwrap();

    // A new store over the same data, JSON (the default), as after the game changed back and restarted.
    drop(store);
    let json = WorldStore::new(data.path(), runtime.handle().clone());
    assert_eq!(json.codec(), Codec::Json);
    let load = || runtime.block_on(json.load::<Terrain>(&world, "terrain"));
    assert_eq!(load().unwrap(), Some(terrain(1)), "postcard saves load under JSON: the file names its codec");
    json.save(&world, "terrain", terrain(2)).wait().unwrap();
    assert!(header(&json, &world, "terrain").contains(" codec=json "));
    damage(&json.document_path(&world, "terrain").unwrap(), "torn");
    assert_eq!(load().unwrap(), Some(terrain(1)), "and the postcard previous save is the fallback");
}

#[test]
fn a_save_in_a_codec_this_build_does_not_know_is_an_error_not_a_fallback() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("future");
    store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
    // An intact file from a newer build, in a codec this one has never heard of.
    let payload = b"\xa1ecount\x03";
    let mut file = format!(
        "bevy-agent-tools-document v1 len={} crc32={:08x} codec=cbor\n",
        payload.len(),
        crc32fast::hash(payload)
    )
    .into_bytes();
    file.extend_from_slice(payload);
    std::fs::write(store.document_path(&world, "progress").unwrap(), file).unwrap();

    let error = runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap_err();
    assert!(matches!(error, bevy_agent_tools::StoreError::UnknownCodec { .. }), "not the previous save: {error:?}");
    assert!(error.to_string().contains("codec `cbor`"), "{error}");
}

#[test]
fn a_damaged_codec_name_is_damage_and_the_previous_save_loads() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("bitrot");
    store.save(&world, "progress", Progress { count: 1 }).wait().unwrap();
    store.save(&world, "progress", Progress { count: 2 }).wait().unwrap();
    let path = store.document_path(&world, "progress").unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let name = bytes.windows(11).position(|w| w == b" codec=json").unwrap() + " codec=js".len();
    bytes[name] ^= 0x01; // `json` reads `jsnn`: a codec no build knows
    std::fs::write(&path, bytes).unwrap();

    let loaded = runtime.block_on(store.load::<Progress>(&world, "progress"));
    assert_eq!(loaded.unwrap(), Some(Progress { count: 1 }), "damage, not a newer build's codec: the previous save");
}

/// Needs `deserialize_any`, which postcard cannot do.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(untagged)]
enum Loose {
    Count(u64),
    Name(String),
}

#[test]
fn postcard_refuses_self_describing_serde_features_with_a_decode_error() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("loose");
    for (codec, loads) in [(Codec::Json, true), (Codec::Postcard, false)] {
        let store = store.clone().with_codec(codec);
        store.save(&world, codec.name(), Loose::Name("oak".into())).wait().unwrap();
        match runtime.block_on(store.load::<Loose>(&world, codec.name())) {
            Ok(loaded) => assert!(loads && loaded == Some(Loose::Name("oak".into())), "{codec}: {loaded:?}"),
            Err(error) => {
                assert!(!loads, "{codec}: {error}");
                assert!(matches!(error, bevy_agent_tools::StoreError::Decode { .. }), "{error:?}");
                assert!(error.to_string().contains("postcard"), "says which codec failed: {error}");
            }
        }
    }
}

#[test]
fn postcard_encode_failure_is_an_encode_error_and_the_previous_save_stays() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let store = store.with_codec(Codec::Postcard);
    let world = WorldId::new("halfway");
    store.save(&world, "progress", Progress { count: 4 }).wait().unwrap();
    // `FailsHalfway` is a sequence of unknown length: postcard refuses it before writing anything of it.
    let error = runtime.block_on(store.save_async(&world, "progress", FailsHalfway)).unwrap_err();
    assert!(matches!(error, bevy_agent_tools::StoreError::Encode { .. }), "{error:?}");
    assert!(error.to_string().contains("postcard"), "{error}");
    assert_eq!(runtime.block_on(store.load::<Progress>(&world, "progress")).unwrap(), Some(Progress { count: 4 }));
}

#[test]
fn the_plugins_codec_choice_reaches_the_lifecycles_saves() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game_with(Saves::default(), WorldStorePlugin::new(data.path()).codec(Codec::Postcard));
    assert_eq!(store(&app).codec(), Codec::Postcard);
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(1));
    app.exit_world();
    last_close(&mut app).wait_timeout(DEADLINE).expect("the save resolves").expect("the save succeeds");
    assert!(header(&store(&app), &WorldId::new("alpha"), "progress").contains(" codec=postcard "));

    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(2), "the next visit loads the postcard save");
}

// Record documents: `save_records`.

/// 60,000 records: enough for several encoding threads on any machine with more than one core.
fn many_cells() -> Vec<Cell> {
    (0..60_000)
        .map(|i| Cell {
            x: i - 30_000,
            y: i % 64,
            block: ["stone", "grass", "water \"deep\""][i as usize % 3].to_string(),
            tags: vec![i as u16; (i % 3) as usize],
        })
        .collect()
}

#[test]
fn save_records_writes_the_same_file_as_save_of_the_vec_and_loads_as_one() {
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("records");
    for codec in [Codec::Json, Codec::Postcard] {
        let store = store.clone().with_codec(codec);
        let (whole, in_runs) = (format!("whole-{codec}"), format!("runs-{codec}"));
        store.save(&world, &whole, many_cells()).wait().unwrap();
        store.save_records(&world, &in_runs, many_cells()).wait().unwrap();
        let read = |document: &str| std::fs::read(store.document_path(&world, document).unwrap()).unwrap();
        assert!(read(&whole) == read(&in_runs), "{codec}: byte for byte the file `save` writes, header included");
        let loaded = runtime.block_on(store.load::<Vec<Cell>>(&world, &in_runs)).unwrap();
        assert_eq!(loaded, Some(many_cells()), "{codec}: loads as a Vec");
    }
}

#[test]
fn a_record_that_fails_to_encode_fails_save_records_and_the_previous_save_stays() {
    struct Record(u32);
    impl Serialize for Record {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            match self.0 {
                50_000 => Err(serde::ser::Error::custom("record 50000 cannot be encoded")),
                n => serializer.serialize_u32(n),
            }
        }
    }
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("records");
    store.save(&world, "numbers", vec![1u32, 2, 3]).wait().unwrap();

    let error = store.save_records(&world, "numbers", (0..60_000).map(Record).collect()).wait().unwrap_err();
    assert!(error.message().contains("record 50000 cannot be encoded"), "the record's own message: {error}");
    assert_eq!(runtime.block_on(store.load::<Vec<u32>>(&world, "numbers")).unwrap(), Some(vec![1, 2, 3]));
    let temporaries = std::fs::read_dir(store.world_dir(&world).unwrap())
        .unwrap()
        .filter(|entry| entry.as_ref().unwrap().file_name().to_string_lossy().starts_with('.'))
        .count();
    assert_eq!(temporaries, 0, "the partly written temporary file was removed");
}

#[test]
fn a_record_that_panics_fails_save_records_with_its_own_panic_like_save_and_never_hangs() {
    struct Record(u32);
    impl Serialize for Record {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            assert_ne!(self.0, 20_000, "a game's Serialize that panics");
            serializer.serialize_u32(self.0)
        }
    }
    let data = tempfile::tempdir().unwrap();
    let (runtime, store) = runtime_and_store(data.path());
    let world = WorldId::new("records");
    store.save(&world, "numbers", vec![7u32]).wait().unwrap();

    let records = || (0..60_000).map(Record).collect::<Vec<_>>();
    for save in [store.save_records(&world, "numbers", records()), store.save(&world, "numbers", records())] {
        let Some(outcome) = save.wait_timeout(DEADLINE) else {
            runtime.shutdown_background(); // its blocking threads would keep the test from ending
            panic!("the save never resolved");
        };
        let error = outcome.unwrap_err();
        assert!(error.message().contains("`records`"), "names the world: {error}");
        assert!(error.message().contains("a game's Serialize that panics"), "the game's own panic: {error}");
    }
    assert_eq!(runtime.block_on(store.load::<Vec<u32>>(&world, "numbers")).unwrap(), Some(vec![7]));
}

#[test]
#[should_panic(expected = "WorldStorePlugin needs AgentToolsPlugin, which the app does not have")]
fn a_store_plugin_in_an_app_without_agent_tools_plugin_is_a_set_up_mistake_found_at_finish() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(WorldStorePlugin::new(data.path()));
    app.finish();
}
