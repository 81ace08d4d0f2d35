//! The registered tools as MCP shows them, converted once per change of the tool list, for `tools/list` and for
//! a 2026-07-28 client's every `tools/call`, which asks for its tool's input schema (rmcp checks `Mcp-Param-*`
//! headers against it): a conversion per call (the schema copied, flattened, completed) was a good part of the
//! server's time.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::model::Tool;

use crate::agent::AgentHandle;

/// Every registered tool as MCP shows it, by name (in the registry's order, as `tools/list` lists them).
pub(crate) type Converted = Arc<BTreeMap<String, Tool>>;

/// The converted tools, and the count of tool list changes they were converted at.
#[derive(Clone, Default)]
pub(crate) struct ListedTools(Arc<Mutex<Option<(u64, Converted)>>>);

impl ListedTools {
    /// Every registered tool as MCP shows it, converted again if the tool list changed since.
    pub(crate) fn all(&self, agent: &AgentHandle) -> Converted {
        // Read before the tools: a tool registered meanwhile is converted at the next look, not missed.
        let changes = *agent.host().tools_changed.borrow();
        let mut listed = self.0.lock();
        if let Some((_, tools)) = listed.as_ref().filter(|(at, _)| *at == changes) {
            return tools.clone();
        }
        let tools: BTreeMap<String, Tool> =
            agent.tools().iter().map(|info| (info.name.clone(), super::server::to_mcp_tool(info))).collect();
        let tools = Arc::new(tools);
        *listed = Some((changes, tools.clone()));
        tools
    }

    /// Tool `name` as MCP shows it, if it is registered.
    pub(crate) fn get(&self, agent: &AgentHandle, name: &str) -> Option<Tool> {
        self.all(agent).get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{headless_app, CounterGame};
    use crate::{AgentTool, AgentToolsPlugin, CallContext, NoArgs};

    fn tool(name: &str) -> AgentTool<u64> {
        AgentTool::new(name, "Does nothing.", |_: CallContext<u64>, _: NoArgs| async { Ok(()) })
    }

    #[test]
    fn a_tool_registered_or_removed_after_the_tools_were_converted_is_seen_at_the_next_look() {
        let app = headless_app(AgentToolsPlugin::new(CounterGame).with_tool(tool("first")));
        let agent = app.world().resource::<AgentHandle>().clone();
        let listed = ListedTools::default();
        assert!(listed.get(&agent, "first").is_some());
        assert!(Arc::ptr_eq(&listed.all(&agent), &listed.all(&agent)), "converted once while nothing changes");
        agent.register_tool(tool("second")).expect("registers");
        assert!(listed.get(&agent, "second").is_some(), "a tool registered since is converted");
        assert!(agent.unregister_tool("first"));
        assert!(listed.get(&agent, "first").is_none(), "a tool removed since is gone");
    }
}
