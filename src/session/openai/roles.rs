//! The roles of a request's messages as strict chat templates want them.

use serde_json::{json, Value};

/// `messages` with the roles alternating, as strict chat templates want (the Mistral family's under llama.cpp's
/// `--jinja` refuses two user messages in a row): a run of system messages, or of user messages (the player's
/// text and the game's context block, a turn cancelled before the model said anything), becomes one, their texts
/// apart by a blank line, each word for word; a run with an image part in it goes as content parts. An assistant
/// message with no text and no tool calls (a history saved before such answers were left out of it) is dropped:
/// strict endpoints refuse an empty assistant message. Everything else as it is.
pub(super) fn alternating(messages: Vec<Value>) -> Vec<Value> {
    fn parts(content: Value) -> Vec<Value> {
        match content {
            Value::Array(parts) => parts,
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            other => vec![json!({"type": "text", "text": other.to_string()})],
        }
    }
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    for mut message in messages {
        let role = message["role"].as_str().unwrap_or_default().to_string();
        if role == "assistant" && says_nothing(&message) {
            continue;
        }
        let joins = matches!(role.as_str(), "system" | "user")
            && out.last().is_some_and(|last| last["role"].as_str() == Some(role.as_str()));
        let (Some(last), true) = (out.last_mut(), joins) else {
            out.push(message);
            continue;
        };
        let content = message["content"].take();
        let before = last["content"].take();
        last["content"] = match (before, content) {
            // Text only: one string (servers that take no content parts take it), the texts apart by a blank line.
            (Value::String(before), Value::String(content)) => Value::String(format!("{before}\n\n{content}")),
            (before, content) => Value::Array(parts(before).into_iter().chain(parts(content)).collect()),
        };
    }
    out
}

/// Whether an assistant message has neither text nor tool calls.
fn says_nothing(message: &Value) -> bool {
    let no_text = match &message["content"] {
        Value::Null => true,
        Value::String(text) => text.is_empty(),
        Value::Array(parts) => parts.is_empty(),
        _ => false,
    };
    no_text && message.get("tool_calls").is_none_or(Value::is_null)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn runs_of_system_or_user_messages_become_one_and_the_rest_stays() {
        let messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "system", "content": "[3 earlier turns were dropped]"}),
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "hello"}),
            json!({"role": "user", "content": "stop"}),
            json!({"role": "user", "content": "build a tower"}),
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
            json!({"role": "tool", "tool_call_id": "a", "content": "1"}),
            json!({"role": "tool", "tool_call_id": "b", "content": "2"}),
        ];
        let merged = super::alternating(messages);
        let roles: Vec<&str> = merged.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant", "tool", "tool"]);
        assert_eq!(merged[0]["content"], "Be brief.\n\n[3 earlier turns were dropped]");
        assert_eq!(merged[1]["content"], "hi", "a lone message is left as it is");
        assert_eq!(
            merged[3]["content"],
            json!([
                {"type": "text", "text": "stop\n\nbuild a tower"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ]),
            "texts joined word for word; with an image, as parts"
        );
        let texts = super::alternating(vec![
            json!({"role": "user", "content": "stop"}),
            json!({"role": "user", "content": "[Game context] day"}),
        ]);
        assert_eq!(texts, [json!({"role": "user", "content": "stop\n\n[Game context] day"})], "text only: a string");
    }

    #[test]
    fn an_empty_assistant_message_is_never_sent_so_a_history_saved_with_one_recovers() {
        let messages = vec![
            json!({"role": "user", "content": "one"}),
            json!({"role": "assistant", "content": ""}),
            json!({"role": "user", "content": "two"}),
            json!({"role": "assistant", "content": null}),
            json!({"role": "assistant", "content": []}),
            json!({"role": "user", "content": "three"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]}),
            json!({"role": "tool", "tool_call_id": "a", "content": "1"}),
        ];
        let merged = super::alternating(messages);
        assert_eq!(
            merged,
            [
                json!({"role": "user", "content": "one\n\ntwo\n\nthree"}),
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]}),
                json!({"role": "tool", "tool_call_id": "a", "content": "1"}),
            ],
            "the empty answers are gone and the player's texts around them are one message"
        );
    }
}
