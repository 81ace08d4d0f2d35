//! Telling clients that the tool list changed: a tool registered while the game runs (a world that registers its
//! tools when it has loaded) is announced with `notifications/tools/list_changed`, so that clients that listed the
//! tools before (at the menu, say) list them again. A 2025-11-25 client is told on its session; a 2026-07-28
//! client, which has no session, is told on the `subscriptions/listen` stream it opened for it.

use std::sync::Arc;

use rmcp::model::{ServerNotification, SubscriptionFilter, ToolListChangedNotification};
use rmcp::service::SubscriptionContext;
use rmcp::{ErrorData, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::agent::AgentHandle;

/// How long an announcement waits for one client's session to take it.
const ANNOUNCE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The clients of the open 2025-11-25 sessions, as they initialized: each is sent
/// `notifications/tools/list_changed` when a tool is registered while the game runs. (Sessionless clients listen
/// with [`listen`].)
#[derive(Clone, Default)]
pub(crate) struct Peers(Arc<parking_lot::Mutex<Vec<rmcp::Peer<RoleServer>>>>);

impl Peers {
    pub(crate) fn add(&self, peer: rmcp::Peer<RoleServer>) {
        self.open().push(peer);
    }

    /// The clients, those whose session closed left out.
    fn open(&self) -> parking_lot::MutexGuard<'_, Vec<rmcp::Peer<RoleServer>>> {
        let mut peers = self.0.lock();
        peers.retain(|peer| !peer.is_transport_closed());
        peers
    }

    /// Tells every client whose session is open that the tool list changed, each time a tool is registered,
    /// until `stop`.
    pub(crate) fn spawn_announcer(
        &self,
        agent: &AgentHandle,
        runtime: &tokio::runtime::Handle,
        stop: CancellationToken,
    ) {
        let mut changed = agent.host().tools_changed.subscribe();
        let peers = self.clone();
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = changed.changed() => if changed.is_err() { return },
                }
                let open = peers.open().clone();
                for peer in open {
                    // Each on its own, bounded: a client that stopped reading (a suspended process) must not keep
                    // the others, or later registrations, from being announced. One that went away meanwhile is not
                    // the game's problem.
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(ANNOUNCE_WAIT, peer.notify_tool_list_changed()).await;
                    });
                }
            }
        });
    }
}

/// What a `subscriptions/listen` request is granted: tool list changes, if it asked for them.
pub(crate) fn accepted(requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
    Some(requested.intersection(&SubscriptionFilter::builder().tools_list_changed().build()))
}

/// How many tools had been registered when a request arrived (in its extensions): a listener compares it with the
/// count when it starts listening, which is after rmcp has acknowledged the request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ToolsSeen(u64);

/// Notes in each request how many tools had been registered when it arrived ([`ToolsSeen`]).
pub(crate) async fn note_tools_seen(
    axum::extract::State(agent): axum::extract::State<AgentHandle>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let seen = *agent.host().tools_changed.borrow();
    request.extensions_mut().insert(ToolsSeen(seen));
    next.run(request).await
}

/// Serves one `subscriptions/listen` stream (2026-07-28) until its client closes it or the game exits: each time
/// a tool is registered, `notifications/tools/list_changed` on it. A tool registered after the request arrived but
/// before this listens (rmcp acknowledges the request first, and the client may already act on it) is announced at
/// once. At the exit (`end`) it returns, so rmcp sends the request's final result (a graceful end, which a client
/// tells from a dropped connection, and need not reconnect after); the exit waits for that as for a call's
/// outcome, where before it its exchange may last for ever.
pub(crate) async fn listen(
    agent: &AgentHandle,
    subscription: SubscriptionContext,
    end: &CancellationToken,
) -> Result<(), ErrorData> {
    let parts = subscription.request_context().extensions.get::<axum::http::request::Parts>();
    if let Some(exchange) = parts.and_then(|parts| parts.extensions.get::<Arc<super::exchanges::Exchange>>()) {
        let ending = end.clone();
        exchange.answers(Arc::new(move || !ending.is_cancelled()));
    }
    let seen = parts.and_then(|parts| parts.extensions.get::<ToolsSeen>()).map(|seen| seen.0);
    let mut changed = agent.host().tools_changed.subscribe();
    let wanted = subscription.accepted().tools_list_changed == Some(true);
    let mut missed = wanted && seen.is_some_and(|seen| *changed.borrow_and_update() != seen);
    loop {
        if !std::mem::take(&mut missed) {
            tokio::select! {
                () = subscription.cancelled() => return Ok(()),
                () = end.cancelled() => return Ok(()),
                changed = changed.changed(), if wanted => if changed.is_err() { return Ok(()) },
            }
        }
        let announcement = ServerNotification::ToolListChangedNotification(ToolListChangedNotification::default());
        // Bounded, as for sessions: a client that stopped reading is not waited for.
        if let Ok(Err(error)) = tokio::time::timeout(ANNOUNCE_WAIT, subscription.sink().send(announcement)).await {
            tracing::debug!(%error, "a tool list change could not be sent to a listening MCP client");
        }
    }
}
