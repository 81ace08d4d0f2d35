//! The chunks of a streamed answer, as lenient as the servers that send them (`byot`: local servers omit fields
//! OpenAI always sends, or send them `null`), read only as far as a turn's limits.

use serde::Deserialize;
use serde_json::Value;

/// One streamed chunk, as lenient as the servers that send it: a field may be missing or `null` (`#[serde(default)]`
/// alone covers only a missing one, and some servers send `"choices": null`, `"delta": null` or null token counts),
/// and text may come as content parts ([`text_or_parts`]).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Chunk {
    #[serde(default, deserialize_with = "first_few")]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<UsageReport>,
    /// An error reported inside the stream (some servers do, after a `200`; llama.cpp's `error:` line comes as
    /// this too, see [`DoneWatch`](super::answer_end::DoneWatch)).
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Choice {
    #[serde(default, deserialize_with = "null_as_default")]
    pub delta: Delta,
    /// Why the answer ended; `""` is none (older Ollama and SGLang send it on every chunk).
    #[serde(default, deserialize_with = "empty_as_none")]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default, deserialize_with = "text_or_parts")]
    pub content: Option<String>,
    #[serde(default, deserialize_with = "some_first_few")]
    pub tool_calls: Option<Vec<ToolCallChunk>>,
    /// A reasoning model's thinking, as llama.cpp's server, vLLM and LM Studio send it.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// The same, as Ollama sends it.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// OpenRouter's reasoning blocks ([`ReasoningDetails`](super::reasoning_details::ReasoningDetails)): the pieces
    /// of a list, at most [`LIST_LIMIT`] a delta; anything else is not OpenRouter's, and is left out.
    #[serde(default, deserialize_with = "first_few_of_a_list")]
    pub reasoning_details: Vec<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToolCallChunk {
    #[serde(default)]
    pub index: Option<usize>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionChunk>,
    /// What the server wants back with the call (Gemini's `{"google": {"thought_signature": ...}}`: without it,
    /// its next request is refused).
    #[serde(default)]
    pub extra_content: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionChunk {
    #[serde(default)]
    pub name: Option<String>,
    /// Text to append; a JSON value given in its place (LiteLLM's proxy streams an object) is its text.
    #[serde(default, deserialize_with = "text_or_json")]
    pub arguments: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct UsageReport {
    #[serde(default, deserialize_with = "null_as_default")]
    pub prompt_tokens: u64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub completion_tokens: u64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub total_tokens: u64,
}

/// A field given as `null` read as its default, as a missing one is.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The most elements of a chunk's list read (its choices, a delta's tool calls): one more than the calls an answer
/// may hold, so that the turn still sees it pass that limit. The rest are skipped unread: a server's million empty
/// `{}` would each cost a hundred times their size once read.
pub(crate) const LIST_LIMIT: usize = super::turn::MAX_CALLS_PER_ANSWER + 1;

/// A list, at most its first [`LIST_LIMIT`] elements; `null` as none.
fn first_few<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct FirstFew<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for FirstFew<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list or null")
        }

        fn visit_unit<E>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            keep_first(seq)
        }
    }

    deserializer.deserialize_any(FirstFew(std::marker::PhantomData))
}

/// A list's first [`LIST_LIMIT`] elements; the rest skipped unread.
fn keep_first<'de, A: serde::de::SeqAccess<'de>, T: Deserialize<'de>>(mut seq: A) -> Result<Vec<T>, A::Error> {
    let mut kept = Vec::new();
    while kept.len() < LIST_LIMIT {
        match seq.next_element()? {
            Some(element) => kept.push(element),
            None => return Ok(kept),
        }
    }
    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
    Ok(kept)
}

/// [`first_few`], as the optional list it stands for.
fn some_first_few<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    first_few(deserializer).map(Some)
}

/// [`first_few`] of a list; anything else read (and skipped) as no elements.
fn first_few_of_a_list<'de, D>(deserializer: D) -> Result<Vec<Value>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct FirstFewOfAList;

    impl<'de> serde::de::Visitor<'de> for FirstFewOfAList {
        type Value = Vec<Value>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("anything")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<Value>, A::Error> {
            keep_first(seq)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Vec<Value>, A::Error> {
            while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
            Ok(Vec::new())
        }

        fn visit_unit<E>(self) -> Result<Vec<Value>, E> {
            Ok(Vec::new())
        }

        fn visit_bool<E>(self, _: bool) -> Result<Vec<Value>, E> {
            Ok(Vec::new())
        }

        fn visit_i64<E>(self, _: i64) -> Result<Vec<Value>, E> {
            Ok(Vec::new())
        }

        fn visit_u64<E>(self, _: u64) -> Result<Vec<Value>, E> {
            Ok(Vec::new())
        }

        fn visit_f64<E>(self, _: f64) -> Result<Vec<Value>, E> {
            Ok(Vec::new())
        }

        fn visit_str<E>(self, _: &str) -> Result<Vec<Value>, E> {
            Ok(Vec::new())
        }
    }

    deserializer.deserialize_any(FirstFewOfAList)
}

/// A string, `""` read as none.
fn empty_as_none<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(Option::<String>::deserialize(deserializer)?.filter(|text| !text.is_empty()))
}

/// A string as it is; any other JSON value (but `null`) as its JSON text.
fn text_or_json<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => Some(other.to_string()),
    })
}

/// A message's text: a string, or content parts (`[{"type": "text", "text": ...}]`, as Mistral's API sends it),
/// whose text parts are read in order and joined; parts of other types (a reasoning model's `thinking`) are left
/// out, as reasoning is. Anything else is malformed.
fn text_or_parts<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(Value::Array(parts)) => Ok(Some(
            parts
                .iter()
                .filter_map(|part| match part {
                    Value::String(text) => Some(text.as_str()),
                    Value::Object(part) if part.get("type").is_none_or(|kind| kind == "text") => {
                        part.get("text").and_then(Value::as_str)
                    }
                    _ => None,
                })
                .collect(),
        )),
        Some(other) => {
            Err(serde::de::Error::custom(format!("content is neither text nor an array of content parts: {other}")))
        }
    }
}
