//! The world store through the host: completion without a tick (H6), overlapping visits (H7), a clean shutdown,
//! failing saves, and damaged saves falling back to the previous one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bevy::app::AppExit;
use bevy::ecs::message::Messages;
use bevy::prelude::*;
use bevy_agent_tools::persist::{Loaded, WorldStore, WorldStorePlugin};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{NoArgs, VisitClosed, VisitSaved, WorldId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(10);
const SLOW_WRITE: Duration = Duration::from_millis(300);

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
    /// Makes serializing the snapshot this slow: the save is then still serializing, not yet in its I/O, when
    /// the next visit's load is called.
    slow_snapshot: Option<Duration>,
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
        match self.slow_snapshot {
            Some(delay) => store.save(&session.world, "progress", SlowToSerialize(progress, delay)),
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

/// A snapshot whose serialization (on the store's thread) takes a while.
struct SlowToSerialize(Progress, Duration);

impl Serialize for SlowToSerialize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        std::thread::sleep(self.1);
        self.0.serialize(serializer)
    }
}

fn game(saves: Saves, data: &Path) -> App {
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
        .add_plugins(WorldStorePlugin::new(data));
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

/// Delays every write by `delay` (in the store's I/O thread, before the commit).
fn slow_writes(store: &WorldStore, delay: Duration) {
    store.set_write_faults(move |_: &WorldId, _: &str| {
        std::thread::sleep(delay);
        Ok(())
    });
}

#[test]
fn h6_completion_resolves_without_another_frame_and_the_file_has_the_new_content() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves::default(), data.path());
    app.enter_world("alpha");
    assert_eq!(call(&mut app, "bump"), json!(1));
    assert_eq!(call(&mut app, "bump"), json!(2));

    app.exit_world();
    let completion = last_close(&mut app);
    // From here on, no app.update(): nothing on the save path may wait for the main thread.
    assert_eq!(completion.wait_timeout(DEADLINE), Some(Ok(())), "the save resolves with no further frame");
    assert!(on_disk(&app, "alpha").ends_with(r#"{"count":2}"#), "durable content: {}", on_disk(&app, "alpha"));
}

#[test]
fn h7_reentering_a_world_while_its_save_is_in_flight_loads_what_the_previous_visit_saved() {
    let data = tempfile::tempdir().unwrap();
    let mut app = game(Saves { slow_snapshot: Some(SLOW_WRITE), ..Default::default() }, data.path());
    app.enter_world("alpha");
    for _ in 0..3 {
        call(&mut app, "bump");
    }
    slow_writes(&store(&app), SLOW_WRITE);

    app.exit_world();
    let save = last_close(&mut app);
    app.enter_world("alpha");
    assert!(!save.is_done(), "the next visit opened while the previous one was still saving");

    assert_eq!(call(&mut app, "read"), json!(3), "the load waited for the in-flight save");
    assert!(save.is_done());
    assert_eq!(call(&mut app, "bump"), json!(4), "the new visit has its own state, carried on from the save");
}

#[test]
fn h7_two_worlds_saving_at_once_do_not_wait_for_each_other() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let data = tempfile::tempdir().unwrap();
    let store = WorldStore::new(data.path(), runtime.handle().clone());
    slow_writes(&store, SLOW_WRITE);

    let started = Instant::now();
    store.save(&WorldId::new("solo"), "progress", Progress { count: 1 }).wait().unwrap();
    let one = started.elapsed();

    let started = Instant::now();
    let east = store.save(&WorldId::new("east"), "progress", Progress { count: 1 });
    let west = store.save(&WorldId::new("west"), "progress", Progress { count: 1 });
    Completion::all([east, west]).wait_timeout(DEADLINE).expect("both resolve").unwrap();
    let two = started.elapsed();

    assert!(one >= SLOW_WRITE, "the injected delay applied: {one:?}");
    assert!(two.as_secs_f64() < 1.8 * one.as_secs_f64(), "two worlds took {two:?}, one took {one:?}: they serialized");
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
    slow_writes(&store(&app), SLOW_WRITE);
    for world in ["alpha", "beta"] {
        app.enter_world(world);
        call(&mut app, "bump");
        app.exit_world();
        in_flight.lock().push(last_close(&mut app));
    }
    assert!(in_flight.lock().iter().all(|c| !c.is_done()), "both saves are in flight at AppExit");

    app.world_mut().write_message(AppExit::Success);
    app.update();

    assert_eq!(
        *seen_at_shutdown.lock(),
        vec![r#"durable=true files=["{\"count\":1}", "{\"count\":1}"]"#.to_string()],
        "shutdown ran once, after both saves were durable"
    );
    app.update();
    assert_eq!(shutdowns.load(Ordering::SeqCst), 1, "shutdown is called exactly once");
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
