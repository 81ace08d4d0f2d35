//! The roles of a request's messages as strict chat templates want them.

use serde_json::{json, Value};

/// `messages` with the roles alternating, as strict chat templates want (the Mistral family's under llama.cpp's
/// `--jinja` refuses two user messages in a row): a run of system messages, or of user messages (the player's
/// text and the game's context block, a turn cancelled before the model said anything), becomes one, their texts
/// apart by a blank line, each word for word; a run with an image part in it goes as content parts. An assistant
/// message with no text and no tool calls (a history saved before such answers were left out of it) is dropped:
/// strict endpoints refuse an empty assistant message. A user message right after tool results (a turn that ended
/// there: an empty answer, a cancel, the token limit) gets [`NO_REPLY`] as the model's answer before it: those
/// templates check the alternation with tool results and the assistant messages that carry tool calls left out,
/// so there it would follow the previous user message (and Mistral's API refuses a user message right after a
/// tool result outright). The message of the tools' images ([`TOOL_IMAGES`]) gets [`IMAGES_FOLLOW`] instead: the
/// model's reply to the round is still due after it, and a `(no reply)` would tell it it had answered.
/// Everything else as it is.
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
        if role == "user" && out.last().is_some_and(awaits_reply) {
            let bridge = if is_tool_images(&message) { IMAGES_FOLLOW } else { NO_REPLY };
            out.push(json!({"role": "assistant", "content": bridge}));
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

/// The model's answer where it gave none after tool results and a user message follows ([`alternating`]).
pub(super) const NO_REPLY: &str = "(no reply)";

/// The first text of the user message that carries the tools' images after their results (chat completions take
/// images in user messages only). The model's reply to the round is still due after it: [`IMAGES_FOLLOW`] before
/// it, not [`NO_REPLY`].
pub(super) const TOOL_IMAGES: &str = "[The images the game's tools returned, in order]";

/// The assistant message between the tools' results and their images ([`alternating`]), where strict templates
/// and Mistral's API want the model's answer after a tool result: it says what comes, not that the model answered.
pub(super) const IMAGES_FOLLOW: &str = "(The tools returned images: they follow.)";

/// Whether a user message is the one carrying the tools' images ([`TOOL_IMAGES`]).
fn is_tool_images(message: &Value) -> bool {
    message["content"][0]["text"].as_str() == Some(TOOL_IMAGES)
}

/// Whether a message leaves the model's reply due, as strict templates count replies: a tool result, or an
/// assistant message with tool calls (templates that check the alternation leave both out).
fn awaits_reply(message: &Value) -> bool {
    match message["role"].as_str() {
        Some("tool") => true,
        Some("assistant") => !message.get("tool_calls").is_none_or(Value::is_null),
        _ => false,
    }
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
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant", "tool", "tool"], "{merged:#?}");
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

    /// The roles as a strict chat template checks them (Mistral's under llama.cpp's `--jinja`): tool results and
    /// assistant messages with tool calls left out, the rest alternating user, assistant, from the first user one.
    fn alternate_as_strict_templates_check(messages: &[serde_json::Value]) -> bool {
        let checked = messages.iter().filter(|m| m["role"] != "system" && m["role"] != "tool");
        let roles: Vec<&str> =
            checked.filter(|m| m.get("tool_calls").is_none()).map(|m| m["role"].as_str().unwrap()).collect();
        roles.iter().enumerate().all(|(n, role)| *role == if n % 2 == 0 { "user" } else { "assistant" })
    }

    #[test]
    fn a_user_message_right_after_tool_results_follows_a_no_reply_answer_so_strict_templates_alternate() {
        let calls = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]});
        let result = json!({"role": "tool", "tool_call_id": "a", "content": "1"});
        // As saved by turns that ended after their tool results (an empty answer, a cancel), then the next turn.
        let messages = vec![
            json!({"role": "user", "content": "one"}),
            calls.clone(),
            result.clone(),
            json!({"role": "assistant", "content": ""}),
            json!({"role": "user", "content": "two"}),
            calls.clone(),
            result.clone(),
            json!({"role": "user", "content": "three"}),
            calls,
            result,
        ];
        assert!(!alternate_as_strict_templates_check(&messages), "what strict templates refused");
        let sent = super::alternating(messages);
        assert!(alternate_as_strict_templates_check(&sent), "{sent:#?}");
        let no_reply = json!({"role": "assistant", "content": super::NO_REPLY});
        assert_eq!((&sent[3], &sent[7]), (&no_reply, &no_reply), "{sent:#?}");
        assert_eq!(sent.len(), 11, "the empty answer dropped, two added, none at the end: {sent:#?}");
        assert_eq!(sent[10]["role"], "tool", "the model's reply to the last results is the one asked for");
    }

    #[test]
    fn the_tools_images_after_their_results_follow_an_answer_saying_they_follow_not_a_no_reply() {
        let calls = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]});
        let result = json!({"role": "tool", "tool_call_id": "a", "content": "1"});
        let images = json!({"role": "user", "content": [
            {"type": "text", "text": super::TOOL_IMAGES},
            {"type": "image_url", "image_url": {"url": "data:x"}},
        ]});
        let messages = vec![json!({"role": "user", "content": "look"}), calls, result, images.clone()];
        assert!(!alternate_as_strict_templates_check(&messages), "what strict templates (and Mistral's API) refused");
        let sent = super::alternating(messages);
        assert!(alternate_as_strict_templates_check(&sent), "{sent:#?}");
        assert_eq!(sent.len(), 5, "one added: {sent:#?}");
        assert_eq!(sent[3], json!({"role": "assistant", "content": super::IMAGES_FOLLOW}), "not a `(no reply)`");
        assert_eq!(sent[4], images);
        // A turn that ended there (an empty answer, a cancel): the player's next text joins the images' message.
        let next = super::alternating(sent.into_iter().chain([json!({"role": "user", "content": "and?"})]).collect());
        assert!(alternate_as_strict_templates_check(&next), "{next:#?}");
    }
}
