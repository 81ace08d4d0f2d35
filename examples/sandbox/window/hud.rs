//! The HUD: where agents connect (the MCP address, or why there is none), where the player is (world, visit,
//! dimension, revision), the agents' calls in flight with their progress, the last calls to finish with their
//! outcome codes, and each conversation's status. Fed only by the crate's messages and resources (and the player's
//! position from the world view), never by asking the host.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpServer, McpUnavailable};
use bevy_agent_tools::{
    CallFinished, CallProgress, CallStarted, ConversationId, ConversationStatus, ConversationStatusChanged, RequestId,
    VisitClosed, VisitInfo, VisitLoadFailed, VisitOpened, VisitRelocated, WorldOpenFailed,
};

use crate::view::WorldView;
use crate::world::Pos;

/// How often the HUD's text may change: four times a second, as fast as a person reads it. Each change lays the
/// text out again and rebuilds its glyphs, and with an agent calling 200 times a second the call list changes
/// every frame (Bevy's FPS overlay refreshes on an interval for the same reason). A change of visit (entering,
/// leaving, travelling) shows at once.
const REFRESH: Duration = Duration::from_millis(250);

/// How many finished calls and conversations the HUD lists.
const LAST_CALLS: usize = 6;
const CONVERSATIONS: usize = 6;

/// What the HUD shows.
#[derive(Resource, Default)]
pub struct Hud {
    /// Where agents connect, as the start-up left it.
    mcp: String,
    visit: Option<VisitInfo>,
    /// Why the world asked for could not be opened, or why the open visit's save did not load (its tools answer
    /// INTERNAL until the player leaves): shown until the next visit opens.
    trouble: Option<String>,
    /// By request and conversation: a retry that joined another conversation's call shares its request id.
    in_flight: BTreeMap<(RequestId, ConversationId), InFlight>,
    finished: VecDeque<String>,
    conversations: BTreeMap<ConversationId, ConversationStatus>,
}

struct InFlight {
    tool: String,
    conversation: ConversationId,
    progress: Option<(f64, Option<f64>)>,
}

/// The HUD's text node.
#[derive(Component)]
pub struct HudText;

pub fn setup(
    mut commands: Commands,
    mut hud: ResMut<Hud>,
    server: Option<Res<McpServer>>,
    unavailable: Option<Res<McpUnavailable>>,
) {
    hud.mcp = match (server, unavailable) {
        (Some(server), _) => match server.replaced_port() {
            Some(taken) => format!("mcp {} (port {taken} was taken)", server.url()),
            None => format!("mcp {}", server.url()),
        },
        (None, Some(unavailable)) => format!("mcp off: {}", unavailable.error),
        (None, None) => "mcp off".into(),
    };
    commands
        .spawn((
            Node {
                position_type: PositionType::Absolute,
                top: px(8),
                left: px(8),
                padding: UiRect::all(px(8)),
                max_width: px(560),
                ..default()
            },
            BackgroundColor(Color::srgba(0.0, 0.0, 0.0, 0.6)),
        ))
        .with_children(|panel| {
            panel.spawn((HudText, Text::new("no world open"), TextFont { font_size: FontSize::Px(15.0), ..default() }));
        });
}

/// Applies this frame's messages to what the HUD shows.
#[allow(clippy::too_many_arguments)]
pub fn read_messages(
    mut hud: ResMut<Hud>,
    mut opened: MessageReader<VisitOpened>,
    mut relocated: MessageReader<VisitRelocated>,
    mut closed: MessageReader<VisitClosed>,
    mut started: MessageReader<CallStarted>,
    mut progress: MessageReader<CallProgress>,
    mut finished: MessageReader<CallFinished>,
    mut statuses: MessageReader<ConversationStatusChanged>,
    mut open_failed: MessageReader<WorldOpenFailed>,
    mut load_failed: MessageReader<VisitLoadFailed>,
) {
    for m in closed.read() {
        if hud.visit.as_ref().is_some_and(|open| open.visit == m.info.visit) {
            hud.visit = None;
        }
    }
    for m in opened.read() {
        hud.visit = Some(m.info.clone());
        hud.trouble = None;
    }
    for m in open_failed.read() {
        hud.trouble = Some(format!("could not open {}: {}", m.world, m.error.message()));
    }
    for m in load_failed.read() {
        if hud.visit.as_ref().is_some_and(|open| open.visit == m.info.visit) {
            hud.trouble = Some(format!("the save of {} did not load: {}", m.info.world, m.error.message()));
        }
    }
    for m in relocated.read() {
        if let Some(open) = hud.visit.as_mut().filter(|open| open.visit == m.visit) {
            open.location = m.to.clone();
        }
    }
    for m in started.read() {
        let call = InFlight { tool: m.tool.clone(), conversation: m.conversation.clone(), progress: None };
        hud.in_flight.insert((m.request, m.conversation.clone()), call);
    }
    for m in progress.read() {
        if let Some(call) = hud.in_flight.get_mut(&(m.request, m.conversation.clone())) {
            call.progress = Some((m.progress, m.total));
        }
    }
    for m in finished.read() {
        hud.in_flight.remove(&(m.request, m.conversation.clone()));
        let outcome = m.code.as_ref().map_or("ok".to_string(), ToString::to_string);
        let line =
            format!("{} {} {outcome} {:.1} ms ({})", m.request, m.tool, m.duration.as_secs_f64() * 1e3, m.conversation);
        hud.finished.push_front(line);
        hud.finished.truncate(LAST_CALLS);
    }
    for m in statuses.read() {
        hud.conversations.insert(m.conversation.clone(), m.status);
        // Ended conversations go first when the list is full.
        while hud.conversations.len() > CONVERSATIONS {
            let ended =
                hud.conversations.iter().find(|(_, s)| **s == ConversationStatus::Ended).map(|(id, _)| id.clone());
            let Some(drop) = ended.or_else(|| hud.conversations.keys().next().cloned()) else { break };
            hud.conversations.remove(&drop);
        }
    }
}

/// What the HUD's text shows now, and whether something changed since.
#[derive(Default)]
pub struct Shown {
    player: Option<Pos>,
    visit: Option<VisitInfo>,
    at: Option<Duration>,
    stale: bool,
}

/// The HUD's text, rewritten when what it shows changed (the world view changes every frame; of it the HUD
/// shows only the player's position), at most every [`REFRESH`] unless the visit changed.
pub fn draw(
    hud: Res<Hud>,
    view: Res<WorldView>,
    time: Res<Time<Real>>,
    mut shown: Local<Shown>,
    mut text: Query<&mut Text, With<HudText>>,
) {
    shown.stale |= hud.is_changed() || shown.player != view.player;
    let now = time.elapsed();
    let due = shown.at.is_none_or(|at| now.saturating_sub(at) >= REFRESH) || shown.visit != hud.visit;
    if !shown.stale || !due {
        return;
    }
    let Ok(mut text) = text.single_mut() else { return };
    *shown = Shown { player: view.player, visit: hud.visit.clone(), at: Some(now), stale: false };
    let rendered = hud.render(&view);
    if text.0 != rendered {
        text.0 = rendered;
    }
}

impl Hud {
    /// The visit open now, as the messages said.
    pub fn visit(&self) -> Option<&VisitInfo> {
        self.visit.as_ref()
    }

    fn render(&self, view: &WorldView) -> String {
        let mut lines = vec![self.mcp.clone()];
        match &self.visit {
            Some(open) => lines.push(format!(
                "world {}  {}  {}  {}",
                open.world, open.visit, open.location.dimension, open.location.revision
            )),
            None => lines.push("no world open (L: worlds)".into()),
        }
        if let Some(trouble) = &self.trouble {
            lines.push(format!("!! {trouble}"));
        }
        if let (Some(pos), Some(_)) = (view.player, &self.visit) {
            lines.push(format!("player {}, {}, {}", pos.x, pos.y, pos.z));
        }
        lines.push(format!("calls in flight: {}", self.in_flight.len()));
        for ((request, _), call) in self.in_flight.iter().take(LAST_CALLS) {
            let progress = match call.progress {
                Some((done, Some(total))) => format!(" {done}/{total}"),
                Some((done, None)) => format!(" {done}"),
                None => String::new(),
            };
            lines.push(format!("  {request} {}{progress} ({})", call.tool, call.conversation));
        }
        lines.push("last calls:".into());
        lines.extend(self.finished.iter().map(|line| format!("  {line}")));
        lines.push("conversations:".into());
        lines.extend(self.conversations.iter().map(|(id, status)| format!("  {id} {status}")));
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use bevy_agent_tools::{CompletionError, DimensionId, Location, LocationRevision, OpenError, VisitId, WorldId};

    use super::*;

    fn info(world: &str, visit: u64) -> VisitInfo {
        let location = Location { dimension: DimensionId::new("overworld"), revision: LocationRevision(0) };
        VisitInfo { visit: VisitId(visit), world: WorldId::new(world), location }
    }

    #[test]
    fn a_world_that_failed_to_open_or_load_says_why_until_the_next_visit_opens() {
        let mut app = App::new();
        app.init_resource::<Hud>()
            .add_message::<VisitOpened>()
            .add_message::<VisitRelocated>()
            .add_message::<VisitClosed>()
            .add_message::<CallStarted>()
            .add_message::<CallProgress>()
            .add_message::<CallFinished>()
            .add_message::<ConversationStatusChanged>()
            .add_message::<WorldOpenFailed>()
            .add_message::<VisitLoadFailed>()
            .add_systems(Update, read_messages);
        let shown = |app: &App| app.world().resource::<Hud>().render(&WorldView::default());
        app.world_mut().write_message(VisitOpened { info: info("alpha", 1) });
        app.world_mut()
            .write_message(VisitLoadFailed { info: info("alpha", 1), error: CompletionError::new("bad crc") });
        app.update();
        assert!(shown(&app).contains("!! the save of alpha did not load: bad crc"), "{}", shown(&app));

        app.world_mut().write_message(VisitOpened { info: info("beta", 2) });
        app.update();
        assert!(!shown(&app).contains("!!"), "{}", shown(&app));
        let failed =
            WorldOpenFailed { world: WorldId::new("gamma"), visit: VisitId(3), error: OpenError::new("no disk") };
        app.world_mut().write_message(failed);
        app.update();
        assert!(shown(&app).contains("!! could not open gamma: no disk"), "{}", shown(&app));
    }
}
