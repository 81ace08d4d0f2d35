//! Tool calls a model wrote into its answer's text: [`TextCalls`].
//!
//! Models trained on the Hermes format (Qwen2.5 and Qwen3, Hermes, many fine-tunes) call a tool by writing
//! `<tool_call>{"name": "...", "arguments": {...}}</tool_call>`, which the server is meant to turn into a
//! structured tool call. When its parser does not (vLLM with another `--tool-call-parser`, a chat template the
//! server does not know, some LM Studio builds), the markup arrives as text: the player would read it, and the
//! call would never run. So from a `<tool_call>` on, the text is held back; at the answer's end the blocks that are
//! calls of a tool the model was offered become its tool calls, and anything else held back is shown after all
//! (nothing the model wrote is lost).

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A call read from the text: the tool's name and its arguments as JSON text.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TextCall {
    pub name: String,
    pub arguments: String,
}

/// Splits an answer's shown text into what is shown now and what may be tool calls.
#[derive(Debug, Default)]
pub(crate) struct TextCalls {
    /// Text not shown yet: the end of the text, which could begin the opening tag, or everything from it on.
    held: String,
    /// Whether the opening tag came: everything from it is held to the end.
    opened: bool,
}

impl TextCalls {
    /// Reads the next `piece` of shown text; returns what can be shown now.
    pub(crate) fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.opened {
            return String::new();
        }
        if let Some(at) = self.held.find(OPEN) {
            self.opened = true;
            let shown = self.held[..at].to_string();
            self.held.drain(..at);
            return shown;
        }
        // All but an end that could begin the opening tag (from its last `<`).
        let keep = match self.held.rfind('<') {
            Some(at) if OPEN.starts_with(&self.held[at..]) => at,
            _ => self.held.len(),
        };
        self.held.drain(..keep).collect()
    }

    /// The text's end: the calls held back, of the tools `offered`, and the text left to show (held back and not
    /// a call: a block of a tool not offered, or that does not read as a call, is shown as it came). Only an answer
    /// whose held-back text is all calls (with white space between them) is read as calls.
    pub(crate) fn finish(self, offered: impl Fn(&str) -> bool) -> (Vec<TextCall>, String) {
        if !self.opened {
            return (Vec::new(), self.held);
        }
        let mut calls = Vec::new();
        let mut rest = self.held.as_str();
        loop {
            rest = rest.trim_start();
            if rest.is_empty() {
                return (calls, String::new());
            }
            let Some(call) = rest.strip_prefix(OPEN).and_then(|block| block.split_once(CLOSE)) else { break };
            let (block, after) = call;
            match read_call(block).filter(|call| offered(&call.name)) {
                Some(call) => calls.push(call),
                None => break,
            }
            rest = after;
        }
        (Vec::new(), self.held)
    }
}

/// One block's call: a JSON object with `name` and `arguments` (or `parameters`), an object or its JSON text.
fn read_call(block: &str) -> Option<TextCall> {
    let Value::Object(call) = serde_json::from_str::<Value>(block.trim()).ok()? else { return None };
    let name = call.get("name")?.as_str()?.to_string();
    let arguments = match call.get("arguments").or_else(|| call.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(_) => return None,
    };
    Some(TextCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is shown, and the calls, of `pieces` streamed, with `bump` the one tool offered.
    fn read(pieces: &[&str]) -> (String, Vec<TextCall>) {
        let mut text_calls = TextCalls::default();
        let mut shown: String = pieces.iter().map(|piece| text_calls.push(piece)).collect();
        let (calls, rest) = text_calls.finish(|name| name == "bump");
        shown.push_str(&rest);
        (shown, calls)
    }

    fn bump(arguments: &str) -> TextCall {
        TextCall { name: "bump".into(), arguments: arguments.into() }
    }

    #[test]
    fn hermes_tool_calls_in_the_text_are_calls_not_shown_whatever_the_pieces() {
        let whole = "Bumping it.\n<tool_call>\n{\"name\": \"bump\", \"arguments\": {\"by\": 2}}\n</tool_call>\n\
                     <tool_call>{\"name\": \"bump\", \"parameters\": \"{}\"}</tool_call>\n";
        let expected = ("Bumping it.\n".to_string(), vec![bump(r#"{"by":2}"#), bump("{}")]);
        assert_eq!(read(&[whole]), expected);
        for at in (1..whole.len()).filter(|at| whole.is_char_boundary(*at)) {
            assert_eq!(read(&[&whole[..at], &whole[at..]]), expected, "cut at {at}");
        }
    }

    #[test]
    fn text_is_shown_as_it_streams_but_for_an_end_that_could_begin_the_tag() {
        let mut text_calls = TextCalls::default();
        assert_eq!(text_calls.push("thinking"), "thinking");
        assert_eq!(text_calls.push(" a < b <tool"), " a < b ");
        assert_eq!(text_calls.push("box"), "<toolbox");
    }

    #[test]
    fn text_that_is_not_all_calls_of_offered_tools_is_shown_as_it_came() {
        assert_eq!(read(&["Hello, ", "world <tool"]), ("Hello, world <tool".to_string(), vec![]));
        for held in [
            "<tool_call>{\"name\": \"delete_world\", \"arguments\": {}}</tool_call>",
            "<tool_call>not json</tool_call>",
            "<tool_call>{\"name\": \"bump\"}</tool_call> and then I said more",
            "<tool_call>{\"name\": \"bump\", \"arguments\": {}}",
        ] {
            let (shown, calls) = read(&["Sure. ", held]);
            assert_eq!((shown, calls), (format!("Sure. {held}"), vec![]), "{held}");
        }
    }
}
