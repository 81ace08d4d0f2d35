//! [`McpPlugin`]: its builder, start-up (bind, token, service) and stop.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use bevy::app::AppExit;
use bevy::prelude::*;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::connections::ConnectionLimits;
use super::credentials::Credentials;
use super::exchanges::{track_exchanges, Exchanges};
use super::limit::{limit_in_flight, InFlightLimit};
use super::listen::{listen, Listening, Replaced};
use super::security::{self, McpConfigError};
use super::server::GameServer;
use super::sessions::ConversationSessions;
use super::McpConfigErrorKind::{Listen, Refused};
use crate::agent::AgentHandle;
use crate::completion::Completion;
use crate::exit::ExitStarted;
use crate::runtime::AgentRuntime;

/// Serves the host's tools over MCP (Streamable HTTP). See the [module docs](crate::mcp).
///
/// Inserts [`McpServer`] when it serves, or [`McpUnavailable`] when it could not start (the game runs on).
#[derive(Clone)]
pub struct McpPlugin {
    address: IpAddr,
    port: u16,
    path: String,
    allow_non_loopback: bool,
    token: Option<String>,
    token_file: Option<PathBuf>,
    allowed_origins: Vec<String>,
    allowed_hosts: Vec<String>,
    max_body_bytes: usize,
    session_idle_timeout: Option<Duration>,
    strict_port: bool,
    limits: ConnectionLimits,
}

/// Shows the token as its first characters only, as the game's log does.
impl std::fmt::Debug for McpPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpPlugin")
            .field("address", &self.address)
            .field("port", &self.port)
            .field("path", &self.path)
            .field("allow_non_loopback", &self.allow_non_loopback)
            .field("token", &self.token.as_deref().map(security::redacted))
            .field("token_file", &self.token_file)
            .field("allowed_origins", &self.allowed_origins)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("limits", &self.limits)
            .field("session_idle_timeout", &self.session_idle_timeout)
            .field("strict_port", &self.strict_port)
            .finish()
    }
}

impl Default for McpPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl McpPlugin {
    /// `127.0.0.1:15777/mcp`, a token generated per run, browser origins of localhost only, 1 MiB bodies.
    pub fn new() -> Self {
        Self {
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 15777,
            path: "/mcp".into(),
            allow_non_loopback: false,
            token: None,
            token_file: None,
            allowed_origins: vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()],
            allowed_hosts: Vec::new(),
            max_body_bytes: 1024 * 1024,
            session_idle_timeout: Some(Duration::from_secs(300)),
            strict_port: false,
            limits: ConnectionLimits { max_connections: 256, request_read_timeout: Duration::from_secs(120) },
        }
    }

    /// How long an MCP 2025-11-25 session may stay silent (no request from its client, no call it made in flight,
    /// and no `GET` stream of its client open) before it expires and its conversation ends. A client that keeps
    /// its `GET` stream open (Claude Code, the TypeScript and Python SDKs do while they run) keeps its session
    /// however quiet it is; its idle time starts when the server finds the stream closed (the client went away
    /// without deleting the session; a connection that died without a word is found at a keep-alive the kernel
    /// gives up on), or finds that its client stopped reading it (for 5 s, with events waiting). Default 5
    /// minutes; `None` keeps sessions until their client deletes them or the conversation ends. An in-game
    /// agent's session (its client presented the session's own token) never expires this way: it closes when the
    /// in-game session ends or fails (with or without a timeout), and the oldest idle one closes when its agent has
    /// more than 8 open (its MCP client reconnected without deleting them). The host's
    /// [`AgentToolsPlugin::conversation_idle_timeout`](crate::AgentToolsPlugin::conversation_idle_timeout) (for
    /// 2026-07-28, which has no sessions) never ends a session's conversation.
    pub fn session_idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.session_idle_timeout = timeout.into();
        self
    }

    /// The port; `0` picks a free one (read it from [`McpServer`]). When the port is taken (another copy of the
    /// game runs, or another program has it) or may not be bound, the server listens on the next free one of the
    /// nine after it, else on any free port, and logs a warning naming both ([`McpServer::replaced_port`]);
    /// clients configured with the old URL must be given [`McpServer::url`]. See [`strict_port`](Self::strict_port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// With `true`, a taken port is not replaced by a free one: the server does not start, and the game runs
    /// without MCP ([`McpUnavailable`]). For setups where every client has the URL written down. Default `false`.
    pub fn strict_port(mut self, strict: bool) -> Self {
        self.strict_port = strict;
        self
    }

    /// The address to bind. Anything but loopback is refused unless [`allow_non_loopback`](Self::allow_non_loopback).
    pub fn bind(mut self, address: IpAddr) -> Self {
        self.address = address;
        self
    }

    /// Allows binding an address other machines can reach. Keep the token secret. Clients on other machines use
    /// the machine's name or address in their URL: list it with [`allowed_hosts`](Self::allowed_hosts). The server
    /// speaks plain HTTP: the token and every call cross the network unencrypted, readable by anyone on it (a
    /// shared Wi-Fi). Across machines, reach it through an SSH tunnel or a TLS reverse proxy instead where you can.
    pub fn allow_non_loopback(mut self) -> Self {
        self.allow_non_loopback = true;
        self
    }

    /// More `Host` header values to accept (`game-pc.lan`, `192.168.1.20`; with a port, only that port), beside
    /// `localhost`, `127.0.0.1`, `::1` and the bound address: what clients on other machines put in their URL when
    /// the game binds a non-loopback address. Any other `Host` is refused (403), against DNS rebinding.
    pub fn allowed_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allowed_hosts = hosts.into_iter().map(Into::into).collect();
        self
    }

    /// Uses this bearer token instead of generating one: 16 or more visible ASCII characters (what an HTTP header
    /// carries as it is). Whitespace around it is dropped, so a token read from a file with its line break works.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into().trim().to_string());
        self
    }

    /// Where to write the token (mode 0600), kept after the game exits. Default: named after the port, in the
    /// user's own directory inside the system's temporary directory (`/tmp/bevy_agent_tools-1000/mcp-15777.token`
    /// on Linux for user 1000: [`McpServer::token_file`] says where), removed when the game exits. A copy whose port
    /// was [replaced](McpServer::replaced_port) writes its token beside this file instead (`mcp-token.15778`,
    /// removed at exit) and keeps this one for the copy that holds the port. The file is replaced atomically at
    /// start-up: a link at `path` is replaced by the file, not followed.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Browser origins allowed to call (patterns like `http://localhost:*`); an empty list allows none. Requests
    /// without `Origin` (every client that is not a web page) pass. Pages of an allowed origin get CORS (their
    /// preflight answered, the answer readable), so a browser client such as the MCP Inspector's direct
    /// connection works; each of their requests still needs the token.
    pub fn allowed_origins(mut self, origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allowed_origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// The largest request body accepted (413 beyond).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// How many connections may be open at once (each client uses a few: one for its `GET` stream, some for its
    /// requests). At the limit, the longest-open connection that never presented a token is closed to make room
    /// (a client presents it with its first request), so connections without the token cannot hold every place;
    /// with none such, a new connection is answered `503` with `Retry-After: 1` and closed. Default 256; at least 1
    /// (`usize::MAX`: as many as the system allows).
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.limits.max_connections = connections.max(1);
        self
    }

    /// How long a request's head, and then its body, may take to arrive once its connection is open or done with
    /// the previous request; past it the connection is closed (`408` for a body). So it also closes a kept-alive
    /// connection that stays idle that long: the default, 120 s, is longer than HTTP clients keep idle
    /// connections for reuse (reqwest, which rmcp's client uses: 90 s; Node: 4 s; httpx: 5 s), so none sends a
    /// request on a connection the server is closing. A response that takes long (a call, a `GET` stream) is not
    /// bounded by it. At least 1 s.
    pub fn request_read_timeout(mut self, timeout: Duration) -> Self {
        self.limits.request_read_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// Checks the configuration as start-up will.
    pub fn validate(&self) -> Result<(), McpConfigError> {
        security::check_bind(self.address, self.allow_non_loopback)?;
        if let Some(token) = self.token.as_deref() {
            if token.chars().count() < 16 {
                return Err(McpConfigError::new(Refused, "the MCP token must be at least 16 characters"));
            }
            // A non-ASCII token cannot be sent in an HTTP header as it is, and one with spaces is read back trimmed
            // and split by some clients: refused at start-up rather than failing every request as a wrong token.
            if !token.bytes().all(|byte| byte.is_ascii_graphic()) {
                return Err(McpConfigError::new(
                    Refused,
                    "the MCP token must be visible ASCII characters (letters, digits, punctuation), without spaces",
                ));
            }
        }
        Ok(())
    }

    fn start(&self, agent: AgentHandle, runtime: &tokio::runtime::Handle) -> Result<McpServer, McpConfigError> {
        self.validate()?;
        let Listening { listener, replaced } = listen(self.address, self.port, self.strict_port)?;
        let unusable = |error: std::io::Error| McpConfigError::new(Listen, format!("the bound port: {error}"));
        let address = listener.local_addr().map_err(unusable)?;
        listener.set_nonblocking(true).map_err(unusable)?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(unusable)?
        };
        let token = match &self.token {
            Some(token) => token.clone(),
            None => security::generate_token()?,
        };
        let token_file = match (&self.token_file, &replaced) {
            (None, _) => security::default_token_path(address.port())?,
            (Some(path), None) => path.clone(),
            // The configured file is the copy's that holds the port: this one's goes beside it.
            (Some(path), Some(_)) => security::beside(path, address.port()),
        };
        security::write_token_file(&token_file, &token)?;
        if let Some(Replaced { port: taken, why }) = &replaced {
            // Not necessarily another copy: whoever holds the port hears the token of every client configured
            // with the game's usual URL and a token of the player's own.
            let own_token = match self.token {
                Some(_) => {
                    "; they send the token to the program that holds it: if that is not a copy of this game, \
                     change the token"
                }
                None => "",
            };
            tracing::warn!(
                taken,
                %why,
                port = address.port(),
                token_file = %token_file.display(),
                "the MCP port {taken} could not be bound ({why}; another copy of the game?): serving on {} \
                 instead, token in {}; clients configured with the old port need the new URL{own_token}",
                address.port(),
                token_file.display()
            );
        }

        let (shutdown, subscriptions_end) = (CancellationToken::new(), CancellationToken::new());
        let credentials = Credentials::new();
        let mut hosts = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
        hosts.push(address.ip().to_string());
        hosts.extend(self.allowed_hosts.iter().cloned());
        if address.ip().is_unspecified() && self.allowed_hosts.is_empty() {
            tracing::warn!(
                %address,
                "MCP is bound to every interface, but only local Host names are accepted: clients on other \
                 machines get 403 until their URL's host is listed with McpPlugin::allowed_hosts"
            );
        }
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(true)
            // 2026-07-28: a call that only returns its result answers as plain JSON (one write, no SSE framing);
            // one that reports progress first still streams, and so does one that takes over a second
            // (`late_answers`).
            .with_json_response(true)
            .with_allowed_hosts(hosts)
            .with_allowed_origins(self.allowed_origins.clone())
            // An empty list allows no browser origin (rmcp would otherwise check nothing).
            .enforce_origin_validation()
            .with_max_request_body_bytes(self.max_body_bytes)
            .with_sse_keep_alive(Some(super::late_answers::KEEP_ALIVE))
            .with_cancellation_token(shutdown.child_token());
        let sessions =
            Arc::new(ConversationSessions::new(agent.clone(), credentials.clone(), self.session_idle_timeout));
        // A session's conversation ends with its session (its own idle timeout, a DELETE), never by the host's
        // conversation idle timeout: that would close the session under a quiet client that listens.
        agent.host().conversations.leave_to_transport(Arc::new(super::naming::is_session_conversation));
        let limit = InFlightLimit {
            agent: agent.clone(),
            sessions: sessions.clone(),
            max_body_bytes: self.max_body_bytes,
            read_timeout: self.limits.request_read_timeout,
        };
        let tools_seen = agent.clone();
        let peers = super::announce::Peers::default();
        peers.spawn_announcer(&agent, runtime, shutdown.child_token());
        let handler = GameServer {
            agent,
            handles: Default::default(),
            clients: Default::default(),
            sessions: sessions.clone(),
            peers,
            announced: Arc::default(),
            listed: Default::default(),
            subscriptions_end: subscriptions_end.clone(),
        };
        sessions.spawn_upkeep(runtime, shutdown.child_token());
        let service: StreamableHttpService<GameServer, ConversationSessions> = StreamableHttpService::new(
            // A server for each session (or sessionless request): its own `announced`.
            move || Ok(GameServer { announced: Arc::default(), ..handler.clone() }),
            sessions.clone(),
            config,
        );
        let exchanges = Arc::new(Exchanges::default());
        let rebinding = security::RebindingCheck(service.clone());
        // Outermost last: rmcp's Host and Origin check (asked first, and again by rmcp), CORS for the allowed web
        // pages (a preflight answered), the token, then the in-flight limit, then rmcp (Host, Origin, body limit);
        // every POST that reaches rmcp is tracked until its response is sent, for the exit; a session's end is answered
        // 204; a resume with nothing left to send, 405, and a request starting something in a session being closed,
        // 404; each request notes how many tools were registered when it arrived (a `subscriptions/listen` acknowledged
        // before it listens announces what it missed); an answer rmcp is slow to give, streamed.
        let router = Router::new()
            .nest_service(&self.path, service)
            .layer(axum::middleware::from_fn(super::late_answers::stream_late_answers))
            .layer(axum::middleware::from_fn_with_state(tools_seen, super::announce::note_tools_seen))
            .layer(axum::middleware::from_fn_with_state(sessions.clone(), super::termination::answer_session_end))
            .layer(axum::middleware::from_fn_with_state(sessions.clone(), super::sessions::refuse_spent_resumes))
            .layer(axum::middleware::from_fn_with_state(sessions.clone(), super::sessions::refuse_closing_sessions))
            .layer(axum::middleware::from_fn_with_state(sessions.clone(), super::sessions::bind_to_agent_sessions))
            .layer(axum::middleware::from_fn_with_state(exchanges.clone(), track_exchanges))
            .layer(axum::middleware::from_fn_with_state(self.max_body_bytes, super::parse::refuse_unparsable))
            .layer(axum::middleware::from_fn_with_state(limit, limit_in_flight))
            .layer(axum::middleware::from_fn_with_state(
                security::Bearer {
                    token: Arc::<str>::from(token.as_str()),
                    credentials: credentials.clone(),
                    token_file: Arc::from(token_file.as_path()),
                    logged: Arc::default(),
                },
                security::require_bearer,
            ))
            .layer(axum::middleware::from_fn(security::cors))
            .layer(axum::middleware::from_fn_with_state(rebinding, security::refuse_foreign));
        let (stop, limits) = (shutdown.clone(), self.limits);
        let (served_tx, served) = Completion::pending();
        runtime.spawn(async move {
            super::connections::serve(listener, router, limits, stop).await;
            served_tx.succeed();
        });
        let url = format!("http://{address}{}", self.path);
        tracing::info!(%url, token_file = %token_file.display(), token = %security::redacted(&token), "serving MCP");
        let stopping = Stopping { exchanges, served };
        Ok(McpServer {
            url,
            address,
            replaced_port: replaced.as_ref().map(|replaced| replaced.port),
            // Files this run named (the default one, or one beside the game's): removed at exit.
            temporary_token_file: self.token_file.is_none() || replaced.is_some(),
            token_file,
            token: token.into(),
            credentials,
            shutdown,
            subscriptions_end,
            stopping,
        })
    }
}

/// The running MCP server: where it listens and where its token is.
#[derive(Resource, Clone)]
pub struct McpServer {
    url: String,
    address: SocketAddr,
    replaced_port: Option<u16>,
    token_file: PathBuf,
    /// The token file is one this run named (the default one, or one beside the game's): removed at exit.
    temporary_token_file: bool,
    token: Arc<str>,
    credentials: Credentials,
    shutdown: CancellationToken,
    /// Ends the `subscriptions/listen` streams, each with its final result, at the exit before the server stops.
    subscriptions_end: CancellationToken,
    stopping: Stopping,
}

/// Shows the token as its first characters only, as the game's log does.
impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("url", &self.url)
            .field("address", &self.address)
            .field("replaced_port", &self.replaced_port)
            .field("token_file", &self.token_file)
            .field("token", &security::redacted(&self.token))
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// What the exit waits for: the responses of calls that ended, then the server's own end.
#[derive(Clone)]
struct Stopping {
    exchanges: Arc<Exchanges>,
    /// Resolves when the server stopped serving (its connections closed, gracefully).
    served: Completion,
}

impl std::fmt::Debug for Stopping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stopping")
    }
}

impl McpServer {
    /// The endpoint, e.g. `http://127.0.0.1:15777/mcp`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bound address (with the port picked when `0` was asked for).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The port the game asked for, when it was taken and the server listens on another ([`address`](Self::address)):
    /// a game that shows players where to connect can say so. `None` when it serves where asked.
    pub fn replaced_port(&self) -> Option<u16> {
        self.replaced_port
    }

    /// The file holding the token (mode 0600). When the port was [replaced](Self::replaced_port) and the game set
    /// [`McpPlugin::token_file`], this copy's file is beside that one, named after its port
    /// (`mcp-token.15778`), so the copy holding the port keeps its own.
    pub fn token_file(&self) -> &Path {
        &self.token_file
    }

    /// The bearer token. Show it only to the person who runs the game.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The per-conversation credentials this server accepts besides its token: mint one for a conversation
    /// (every request presenting it is that conversation's), revoke it when the conversation ends. In-game agent
    /// sessions get theirs the same way. MCP sessions whose client presents a credential are kept as an agent's
    /// are: they do not expire when idle and are not ended to make room for others, and at most 8 are kept per
    /// credential (the longest silent idle one ends for a ninth); revoking the credential closes them.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }
}

impl Plugin for McpPlugin {
    /// Starts the server on the [`AgentToolsPlugin`](crate::AgentToolsPlugin)'s runtime: now, or when that plugin is
    /// added, if it was not yet.
    fn build(&self, app: &mut App) {
        let plugin = self.clone();
        crate::plugin::when_host_built(app, move |app| plugin.start_in(app));
    }

    /// # Panics
    ///
    /// If the app has no `AgentToolsPlugin`.
    fn finish(&self, app: &mut App) {
        let world = app.world();
        if !world.contains_resource::<McpServer>() && !world.contains_resource::<McpUnavailable>() {
            crate::plugin::host_missing("McpPlugin");
        }
    }
}

impl McpPlugin {
    /// Starts the server on the host's runtime and inserts [`McpServer`], or [`McpUnavailable`] saying why not.
    fn start_in(&self, app: &mut App) {
        let agent = app.world().resource::<AgentHandle>().clone();
        let runtime = app.world().resource::<AgentRuntime>().handle().clone();
        match self.start(agent, &runtime) {
            Ok(server) => {
                app.insert_resource(server);
                crate::exit::add_exit_systems(app, || {
                    stop_on_app_exit.in_set(crate::exit::AgentToolsExitSystems::Transport)
                });
            }
            Err(error) => {
                tracing::error!(%error, "the MCP server could not start: the game runs without MCP");
                app.insert_resource(McpUnavailable { error });
            }
        }
    }
}

/// Present instead of [`McpServer`] when the MCP server could not start: its configuration was refused (see
/// [`McpPlugin::validate`]), its port was taken under [`McpPlugin::strict_port`], nothing could be bound, or the
/// token file could not be written. The game runs on without MCP: the host, in-process agents
/// ([`AgentHandle`]) and in-game sessions with an OpenAI-compatible backend work as before; in-game sessions with
/// an ACP agent fail to start with `AGENT_UNAVAILABLE`, naming this error. Show it where the player or author
/// looks (the error is also logged at start-up).
#[derive(Resource, Clone, Debug)]
pub struct McpUnavailable {
    /// Why the server did not start.
    pub error: McpConfigError,
}

/// The least time the exit gives the responses of ended calls, even when saves used up the exit deadline.
const RESPONSE_GRACE: Duration = Duration::from_millis(500);

/// How long the exit waits for the server's connections to close once it stopped (their responses are sent).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Whether the file at `path` holds `token`: read as a plain file only (in a folder others can write to, someone
/// may have put a link to `/dev/zero` or a FIFO there, whose read would hold the exit without end), at most one
/// byte past the token.
fn holds_token(path: &std::path::Path, token: &str) -> bool {
    use std::io::Read;
    let Ok(Ok(file)) = crate::plain_file::open(path) else { return false };
    let mut held = String::new();
    file.take(token.len() as u64 + 1).read_to_string(&mut held).is_ok() && held == token
}

/// On `AppExit`, after the host ended the visit's calls
/// ([`AgentToolsExitSystems::Host`](crate::AgentToolsExitSystems::Host)): ends every `subscriptions/listen` stream,
/// then waits until every call that ended, and every stream that ended, has had its response sent (bounded by what
/// is left of the exit deadline, and at least [`RESPONSE_GRACE`]), then stops the server and waits (up to
/// [`CLOSE_GRACE`]) for its connections to close. Every call has ended by then (the host ends the
/// visit's calls and those waiting for a tool); one whose outcome is still on its way at the deadline is not waited
/// for: its client sees the connection close.
fn stop_on_app_exit(mut exits: MessageReader<AppExit>, server: Res<McpServer>, started: Option<Res<ExitStarted>>) {
    if exits.read().count() == 0 || server.shutdown.is_cancelled() {
        return;
    }
    let now = std::time::Instant::now();
    let deadline = started.map_or(now, |started| started.deadline).max(now + RESPONSE_GRACE);
    // Their final results are then owed as the ended calls' outcomes are.
    server.subscriptions_end.cancel();
    let owed = server.stopping.exchanges.wait_for_ended_calls(deadline, super::stream_log::STALL_TIMEOUT);
    if owed > 0 {
        tracing::warn!(owed, "the MCP server stops with responses still unsent: the exit deadline passed");
    }
    // While the port is still held (no other copy can have written the file since), and only if it is still ours.
    if server.temporary_token_file && holds_token(&server.token_file, &server.token) {
        let _ = std::fs::remove_file(&server.token_file);
    }
    server.shutdown.cancel();
    let closing = deadline.min(std::time::Instant::now() + CLOSE_GRACE);
    if server.stopping.served.wait_timeout(closing.saturating_duration_since(std::time::Instant::now())).is_none() {
        tracing::warn!("the MCP server's connections did not all close in time; the runtime's stop ends them");
    }
}
