//! What keeps the MCP endpoint safe by default: loopback-only binding, a bearer token per run written to a file
//! only the user can read, and the checks in front of the MCP service.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use rmcp::transport::streamable_http_server::StreamableHttpService;

use super::credentials::Credentials;
use super::server::GameServer;
use super::sessions::ConversationSessions;

/// Why the MCP server would not start (an address refused or taken, a token file that cannot be written), or
/// why a token could not be minted (the system's random source failed): its [`kind`](Self::kind), for the game to
/// act on, and a message naming what to change, for a person (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfigError {
    kind: McpConfigErrorKind,
    message: String,
}

/// What kind of failure an [`McpConfigError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum McpConfigErrorKind {
    /// The configuration itself, refused before anything is tried
    /// ([`McpPlugin::validate`](super::McpPlugin::validate)): an address other machines can reach without
    /// `allow_non_loopback`, a token too short or with characters an HTTP header cannot carry.
    Refused,
    /// No port could be listened on: the one asked for was taken under `strict_port`, or no port of the address
    /// could be bound (an address that is not this machine's, a system out of ports).
    Listen,
    /// The token file, or the folder it goes in, could not be written.
    TokenFile,
    /// The system's random source failed (a token could not be made).
    Randomness,
}

impl McpConfigError {
    pub(crate) fn new(kind: McpConfigErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> McpConfigErrorKind {
        self.kind
    }

    /// What went wrong and what to change, in words.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for McpConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for McpConfigError {}

/// Refuses a non-loopback address unless the author opted in.
pub(crate) fn check_bind(address: IpAddr, allow_non_loopback: bool) -> Result<(), McpConfigError> {
    if address.is_loopback() || allow_non_loopback {
        return Ok(());
    }
    Err(McpConfigError::new(
        McpConfigErrorKind::Refused,
        format!(
            "refusing to serve MCP on {address}: it is reachable from other machines. Bind 127.0.0.1, or call \
         McpPlugin::allow_non_loopback() if you really mean to expose the game (and keep the token secret)"
        ),
    ))
}

/// A fresh token: 32 random bytes, hex.
pub(crate) fn generate_token() -> Result<String, McpConfigError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| {
        McpConfigError::new(McpConfigErrorKind::Randomness, format!("no randomness for the MCP token: {error}"))
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes the token to `path`, readable only by the user (mode 0600 on Unix, from the file's creation; the file
/// is replaced atomically, so a client never reads half a token and a link at `path` is replaced, not followed).
pub(crate) fn write_token_file(path: &Path, token: &str) -> Result<(), McpConfigError> {
    let folder = path.parent().filter(|folder| !folder.as_os_str().is_empty());
    folder.map_or(Ok(()), std::fs::create_dir_all).and_then(|()| crate::private::write(path, token.as_bytes())).map_err(
        |error| {
            McpConfigError::new(
                McpConfigErrorKind::TokenFile,
                format!("could not write the MCP token to {}: {error}", path.display()),
            )
        },
    )
}

/// The default token file, named after the port, in the user's own directory inside the system's temporary
/// directory (`/tmp/bevy_agent_tools-1000/mcp-15777.token`; created mode 0700, refused if another user made it).
pub(crate) fn default_token_path(port: u16) -> Result<PathBuf, McpConfigError> {
    let dir = crate::private::default_dir();
    crate::private::ensure_dir(&dir).map_err(|error| {
        McpConfigError::new(
            McpConfigErrorKind::TokenFile,
            format!("the MCP token's default directory: {error} (`McpPlugin::token_file` chooses another place)"),
        )
    })?;
    Ok(dir.join(format!("mcp-{port}.token")))
}

/// A token file next to `path`, named after `port` (`mcp-token` → `mcp-token.15778`): a second copy of the game
/// on another port keeps the first copy's file intact.
pub(crate) fn beside(path: &Path, port: u16) -> PathBuf {
    let mut name = path.file_name().map(|name| name.to_os_string()).unwrap_or_else(|| "mcp-token".into());
    name.push(format!(".{port}"));
    path.with_file_name(name)
}

/// The token, shortened for logs: never logged in full.
pub(crate) fn redacted(token: &str) -> String {
    format!("{}…", token.chars().take(4).collect::<String>())
}

/// What the bearer check accepts: the game's token, and the live per-conversation credentials.
#[derive(Clone)]
pub(crate) struct Bearer {
    pub token: Arc<str>,
    pub credentials: Credentials,
    /// Where the game's token is (for the warning that a client sent another one).
    pub token_file: Arc<Path>,
    /// When a refusal for no token, and for a wrong one, was last logged: at most one of each per
    /// [`REFUSALS_LOGGED_EVERY`].
    pub logged: Arc<parking_lot::Mutex<[Option<std::time::Instant>; 2]>>,
}

/// How often a refused bearer token is logged at most: a client with an old token retries as fast as it likes.
const REFUSALS_LOGGED_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Bearer {
    /// Logs a refusal (never the token presented), unless one of its kind was logged less than
    /// [`REFUSALS_LOGGED_EVERY`] ago. A token revoked a moment ago is an ended session's agent winding down: debug.
    fn log_refusal(&self, presented: Option<&str>) {
        if presented.is_some_and(|token| self.credentials.recently_revoked(token)) {
            tracing::debug!("refused an MCP request with a revoked session credential (its session ended)");
            return;
        }
        let missing = presented.is_none();
        let now = std::time::Instant::now();
        {
            let mut logged = self.logged.lock();
            let last = &mut logged[usize::from(missing)];
            if last.is_some_and(|at| now.saturating_duration_since(at) < REFUSALS_LOGGED_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let presented = if missing { "no bearer token" } else { "a wrong or revoked bearer token" };
        tracing::warn!(
            token_file = %self.token_file.display(),
            "refused an MCP request with {presented} (401): a client set up with another run's token? The game's \
             token is in its token file (at most one of these lines every 10 s)"
        );
    }
}

/// rmcp's own `Host` and `Origin` check (the allow-lists of [`McpPlugin`](super::McpPlugin)), asked before
/// anything else: a page of another origin, or a DNS-rebound host name, gets 403 whatever else its request holds
/// (a token or not, a body over the limit, ...), as MCP's transport requires, by exactly rmcp's rules.
#[derive(Clone)]
pub(crate) struct RebindingCheck(pub StreamableHttpService<GameServer, ConversationSessions>);

impl RebindingCheck {
    /// rmcp's refusal of `request`'s `Host` or `Origin` (403; 400 for one it cannot read), if it refuses them.
    fn refusal(&self, request: &Request) -> impl std::future::Future<Output = Option<Response>> + Send + 'static {
        // Only the headers go in. Past its checks rmcp answers this method 405 and does nothing else.
        let mut probe = Request::new(axum::body::Body::empty());
        *probe.method_mut() = Method::OPTIONS;
        *probe.uri_mut() = request.uri().clone();
        *probe.headers_mut() = request.headers().clone();
        let service = self.0.clone();
        async move {
            let response = service.handle(probe).await;
            matches!(response.status(), StatusCode::FORBIDDEN | StatusCode::BAD_REQUEST)
                .then(|| response.map(axum::body::Body::new))
        }
    }
}

/// Requires `Authorization: Bearer <token>` (the scheme is case-insensitive, as in HTTP): the game's token, or a
/// live per-conversation credential, whose conversation is then put in the request's extensions
/// ([`BoundConversation`](super::credentials::BoundConversation)). Otherwise 401, with a JSON body that says why
/// and an RFC 6750 challenge; the game's token is compared in constant time. `/.well-known/` paths (an OAuth
/// client's discovery) are answered 404 whatever the token: there is nothing to discover.
pub(crate) async fn require_bearer(State(bearer): State<Bearer>, mut request: Request, next: Next) -> Response {
    if request.uri().path().starts_with("/.well-known/") {
        // An OAuth client's discovery (RFC 9728, RFC 8414) after a 401: no metadata, so it stops there, and a
        // person reading the answer learns what to send instead.
        return refusal(StatusCode::NOT_FOUND, "not_found", NO_OAUTH);
    }
    let presented = |request: &Request| {
        // Its connection keeps its place at the connection cap (`connections`).
        if let Some(connection) = request.extensions().get::<Arc<super::connections::Connection>>() {
            connection.presented_token();
        }
    };
    let reason = match presented_bearer(request.headers()) {
        None => MISSING_TOKEN,
        Some(token) if constant_time_eq(token.as_bytes(), bearer.token.as_bytes()) => {
            presented(&request);
            return next.run(request).await;
        }
        Some(token) => match bearer.credentials.conversation_of(token) {
            Some(bound) => {
                presented(&request);
                request.extensions_mut().insert(bound);
                return next.run(request).await;
            }
            None => {
                "wrong or revoked bearer token: send the token from the file the game printed at start-up \
                     (an agent session's own token stops working when the session ends)"
            }
        },
    };
    bearer.log_refusal(presented_bearer(request.headers()));
    let mut response = refusal(StatusCode::UNAUTHORIZED, "unauthorized", reason);
    response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge(reason != MISSING_TOKEN));
    response
}

const MISSING_TOKEN: &str = "missing bearer token: send the header `Authorization: Bearer <token>`, with the token \
    from the file the game printed at start-up (this server does not use OAuth)";

/// The answer to an OAuth client's discovery (`/.well-known/...`).
const NO_OAUTH: &str = "this server does not use OAuth and publishes no authorization metadata: send the header \
    `Authorization: Bearer <token>`, with the token from the file the game printed at start-up";

/// A 401's `WWW-Authenticate` (RFC 6750 §3): the scheme and realm, and `invalid_token` when a token was sent.
fn challenge(token_sent: bool) -> header::HeaderValue {
    header::HeaderValue::from_static(if token_sent {
        r#"Bearer realm="mcp", error="invalid_token", error_description="the token is wrong or revoked""#
    } else {
        r#"Bearer realm="mcp""#
    })
}

/// Refuses a request whose `Host` or `Origin` is not allowed ([`RebindingCheck`]), before anything else.
pub(crate) async fn refuse_foreign(State(check): State<RebindingCheck>, request: Request, next: Next) -> Response {
    let refused = check.refusal(&request);
    match refused.await {
        Some(forbidden) => forbidden,
        None => next.run(request).await,
    }
}

/// The headers a web page's request may carry, when its preflight does not say which it will.
const CORS_REQUEST_HEADERS: &str =
    "authorization, content-type, accept, last-event-id, mcp-session-id, mcp-protocol-version";
/// The response headers a web page may read.
const CORS_EXPOSED_HEADERS: &str = "mcp-session-id, mcp-protocol-version, www-authenticate, retry-after";

/// CORS for the web pages whose `Origin` is allowed ([`McpPlugin::allowed_origins`](super::McpPlugin::allowed_origins);
/// others were refused before this, 403): a browser asks before a request with `Authorization` or a JSON body
/// (a preflight `OPTIONS`, which carries no token: answered here, 204), and shows the page an answer only if it
/// names the page's origin. So the MCP Inspector's direct connection, or a web page of the developer's own,
/// works as any other client; the token is still required for every request but the preflight. A request without
/// `Origin` (every client that is not a web page) is left as it is.
pub(crate) async fn cors(request: Request, next: Next) -> Response {
    let Some(origin) = request.headers().get(header::ORIGIN).cloned() else { return next.run(request).await };
    let preflight =
        request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        // The headers it asks for (2026-07-28's `Mcp-Method` and `Mcp-Name`, one the person added): the origin is
        // allowed, and every request but this one still needs the token.
        let asked = request.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        let allowed = asked.unwrap_or(header::HeaderValue::from_static(CORS_REQUEST_HEADERS));
        let mut response = StatusCode::NO_CONTENT.into_response();
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, header::HeaderValue::from_static("GET, POST, DELETE"));
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allowed);
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, header::HeaderValue::from_static("600"));
        response
    } else {
        let mut response = next.run(request).await;
        let exposed = header::HeaderValue::from_static(CORS_EXPOSED_HEADERS);
        response.headers_mut().insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, exposed);
        response
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.append(header::VARY, header::HeaderValue::from_static("Origin"));
    response
}

/// The token of a request's `Authorization: Bearer <token>` header (the scheme is case-insensitive, as in HTTP).
pub(crate) fn presented_bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// A refusal with a JSON body that says why.
pub(crate) fn refusal(status: StatusCode, error: &str, message: &str) -> Response {
    let body = serde_json::json!({ "error": error, "message": message }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_bind_is_refused_without_opt_in() {
        let public: IpAddr = "0.0.0.0".parse().unwrap();
        assert!(check_bind(public, false).unwrap_err().message().contains("allow_non_loopback"));
        assert!(check_bind(public, true).is_ok());
        assert!(check_bind("127.0.0.1".parse().unwrap(), false).is_ok());
        assert!(check_bind("::1".parse().unwrap(), false).is_ok());
    }

    #[test]
    fn tokens_are_random_and_long() {
        let (a, b) = (generate_token().unwrap(), generate_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(!redacted(&a).contains(&a[4..]));
    }

    #[cfg(unix)]
    #[test]
    fn token_file_is_readable_only_by_the_user() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("bat-token-test-{}", std::process::id()));
        write_token_file(&path, "secret").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret");
        std::fs::remove_file(path).unwrap();
    }
}
