//! Starting the MCP server never stops the game: a taken port is replaced by a free one (or, with `strict_port`,
//! the game runs without MCP), and a server that cannot start leaves [`McpUnavailable`] in its place.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpConfigErrorKind, McpPlugin, McpServer, McpUnavailable};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, AgentTestAppExt};
use common::*;

const TOKEN: &str = "start-test-token-0123456789";

fn game(mcp: McpPlugin) -> App {
    game_logged(mcp).0
}

/// The game, and the WARN and ERROR lines its start-up logged.
fn game_logged(mcp: McpPlugin) -> (App, Vec<String>) {
    common::warnings::with_warnings(|| {
        let tools = AgentToolsPlugin::new(TestGame::default()).with_tool(bump_tool(
            "bump",
            ToolScope::World,
            Arc::default(),
            None,
        ));
        headless_app_with(tools, mcp)
    })
}

/// An `initialize` over raw HTTP; returns the response's status line.
fn initialize(address: SocketAddr) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).lines().next().unwrap_or_default().to_string()
}

/// A port another program holds for the test's length.
fn taken_port() -> (TcpListener, u16) {
    let occupied = TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let port = occupied.local_addr().expect("its address").port();
    (occupied, port)
}

/// Runs a call in process: the host works with or without MCP.
fn bump_runs(app: &mut App) {
    app.enter_world("alpha");
    let call = app.agent().conversation("agent").call("bump", serde_json::json!({"by": 1}));
    let outcome = app.run_until_resolved(&call);
    assert!(outcome.is_ok(), "the game runs its tools: {outcome:?}");
}

#[test]
fn a_taken_port_is_replaced_by_a_free_one_and_mcp_serves_there_and_says_so() {
    let (_occupied, taken) = taken_port();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let first_copys = dir.path().join("mcp-token");
    std::fs::write(&first_copys, "the first copy's token").expect("the first copy's token file");
    let (mut app, logged) = game_logged(McpPlugin::new().port(taken).token(TOKEN).token_file(&first_copys));
    assert!(!app.world().contains_resource::<McpUnavailable>());
    let server = app.world().resource::<McpServer>().clone();
    let port = server.address().port();
    assert!(port != taken && port != 0, "another port: {port}");
    assert_eq!(server.replaced_port(), Some(taken), "the game can tell the port moved");
    assert!(server.url().contains(&format!(":{port}/")), "the URL names the port served: {}", server.url());
    assert_eq!(server.token_file(), dir.path().join(format!("mcp-token.{port}")), "this copy's token file is beside");
    assert_eq!(std::fs::read_to_string(server.token_file()).expect("written"), TOKEN);
    assert_eq!(std::fs::read_to_string(&first_copys).expect("kept"), "the first copy's token", "left intact");
    let warning = logged.iter().find(|line| line.starts_with("WARN")).expect("a warning");
    assert!(
        warning.contains(&format!("taken={taken}")) && warning.contains(&format!("port={port}")),
        "it names both ports: {warning}"
    );
    assert!(initialize(server.address()).contains(" 200 "), "it answers MCP there");
    bump_runs(&mut app);
    app.world_mut().write_message(AppExit::Success);
    app.update();
    assert!(!server.token_file().exists(), "this copy's file goes with it");
    assert_eq!(std::fs::read_to_string(&first_copys).expect("kept"), "the first copy's token", "the other stays");
}

#[cfg(unix)]
#[test]
fn a_fifo_put_in_place_of_the_token_file_neither_holds_the_exit_nor_is_removed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().to_path_buf();
    let (done, exited) = std::sync::mpsc::channel();
    // The game runs on a thread of its own: were the exit to read the FIFO, it would wait for a writer forever.
    std::thread::spawn(move || {
        let (_occupied, taken) = taken_port();
        let first_copys = path.join("mcp-token");
        std::fs::write(&first_copys, "the first copy's token").expect("the first copy's token file");
        let (mut app, _logged) = game_logged(McpPlugin::new().port(taken).token(TOKEN).token_file(&first_copys));
        let server = app.world().resource::<McpServer>().clone();
        // Someone who can write to the folder puts a FIFO where this copy's token file was.
        std::fs::remove_file(server.token_file()).expect("removed");
        let made = std::process::Command::new("mkfifo").arg(server.token_file()).status().expect("mkfifo runs");
        assert!(made.success());
        app.world_mut().write_message(AppExit::Success);
        app.update();
        let _ = done.send(server.token_file().exists());
    });
    let left = exited.recv_timeout(std::time::Duration::from_secs(60)).expect("the exit is not held by the FIFO");
    assert!(left, "a FIFO is not this run's token file: left where it is");
}

#[test]
fn a_port_served_where_asked_is_not_reported_as_replaced() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (app, logged) = game_logged(McpPlugin::new().port(0).token(TOKEN).token_file(dir.path().join("t")));
    assert_eq!(app.world().resource::<McpServer>().replaced_port(), None);
    assert!(logged.is_empty(), "nothing to warn about: {logged:?}");
}

#[test]
fn a_token_file_that_cannot_be_written_leaves_the_game_running_without_mcp() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    // A directory where the file should be.
    let (mut app, logged) = game_logged(McpPlugin::new().port(0).token(TOKEN).token_file(dir.path()));
    assert!(!app.world().contains_resource::<McpServer>());
    let unavailable = &app.world().resource::<McpUnavailable>().error;
    assert_eq!(unavailable.kind(), McpConfigErrorKind::TokenFile, "what the game can act on: {unavailable}");
    let error = unavailable.to_string();
    assert!(error.contains(&dir.path().display().to_string()), "names the file: {error}");
    assert!(logged.iter().any(|line| line.starts_with("ERROR")), "logged: {logged:?}");
    bump_runs(&mut app);
}

#[test]
fn with_strict_port_a_taken_port_leaves_the_game_running_without_mcp() {
    let (_occupied, taken) = taken_port();
    let (mut app, logged) = game_logged(McpPlugin::new().port(taken).strict_port(true).token(TOKEN));
    assert!(logged.iter().any(|line| line.starts_with("ERROR")), "the failure is logged: {logged:?}");
    assert!(!app.world().contains_resource::<McpServer>());
    let unavailable = &app.world().resource::<McpUnavailable>().error;
    assert_eq!(unavailable.kind(), McpConfigErrorKind::Listen, "{unavailable}");
    let error = unavailable.to_string();
    assert!(error.contains(&format!("127.0.0.1:{taken}")), "says which port: {error}");
    bump_runs(&mut app);
    app.world_mut().write_message(AppExit::Success);
    app.update();
}

#[test]
fn a_refused_configuration_leaves_the_game_running_without_mcp() {
    let mut app = game(McpPlugin::new().port(0).token("too-short"));
    assert!(!app.world().contains_resource::<McpServer>());
    let unavailable = &app.world().resource::<McpUnavailable>().error;
    assert_eq!(unavailable.kind(), McpConfigErrorKind::Refused, "{unavailable}");
    let error = unavailable.message();
    assert!(error.contains("at least 16 characters"), "{error}");
    bump_runs(&mut app);
    // A token no client can send (an HTTP header carries visible ASCII as it is) is refused too, not served.
    for token in ["ключ-который-не-отправить", "two words but long enough"] {
        let app = game(McpPlugin::new().port(0).token(token));
        let error = app.world().resource::<McpUnavailable>().error.to_string();
        assert!(error.contains("visible ASCII"), "{token}: {error}");
    }
}

/// A token read from a file keeps its line break; the token clients send (and the token file) has none.
#[test]
fn a_configured_token_read_with_its_line_break_is_the_token_without_it() {
    let app = game(McpPlugin::new().port(0).token(format!("{TOKEN}\n")));
    let server = app.world().resource::<McpServer>();
    assert_eq!(server.token(), TOKEN);
    let written = std::fs::read_to_string(server.token_file()).expect("the token file");
    assert_eq!(written.trim_end(), TOKEN);
}

#[test]
fn the_default_token_file_is_removed_at_exit_and_a_chosen_one_is_kept() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let chosen = dir.path().join("mcp-token");
    for token_file in [None, Some(chosen.clone())] {
        let mut mcp = McpPlugin::new().port(0).token(TOKEN);
        if let Some(path) = &token_file {
            mcp = mcp.token_file(path);
        }
        let mut app = game(mcp);
        let path = app.world().resource::<McpServer>().token_file().to_path_buf();
        assert!(path.is_file(), "written at start: {}", path.display());
        #[cfg(unix)]
        if token_file.is_none() {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let folder = std::fs::metadata(path.parent().expect("a folder")).expect("metadata");
            let user = std::fs::metadata(&path).expect("metadata").uid();
            assert!(
                path.parent().is_some_and(|p| p.ends_with(format!("bevy_agent_tools-{user}"))),
                "{}",
                path.display()
            );
            assert_eq!(folder.permissions().mode() & 0o777, 0o700, "the user's own folder: {}", path.display());
        }
        app.world_mut().write_message(AppExit::Success);
        app.update();
        assert_eq!(path.is_file(), token_file.is_some(), "after the exit: {}", path.display());
    }
}

#[test]
#[should_panic(expected = "McpPlugin needs AgentToolsPlugin, which the app does not have")]
fn an_mcp_plugin_in_an_app_without_agent_tools_plugin_is_a_set_up_mistake_found_at_finish() {
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(McpPlugin::new().port(0).token(TOKEN));
    app.finish();
}
