//! # k3-fuzz — the bodies of k3's fuzz targets
//!
//! One function per untrusted input the engine and daemon read (issue #19 item 2). Each takes
//! arbitrary bytes and must return without panicking: every malformed input is refused with a
//! typed error. The same functions are driven two ways:
//!
//! * by libFuzzer (`fuzz/libfuzzer`, outside the workspace; see `fuzz/README.md`), coverage
//!   guided, to find new inputs;
//! * by `cargo test` (`tests/corpora.rs`), over every committed seed and crash-regression input
//!   in `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`, without any fuzzer installed.
//!
//! Inputs that live in files (tokenizer files, session files, the shard index) go through the
//! real path-based readers: the bytes are written to a private scratch file first, so what is
//! fuzzed is exactly what `k3d` runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k3_engine::checkpoint::safetensors::{Dtype, TensorSpec, encode_header};
use k3_engine::checkpoint::{ModelConfig, TensorIndex};
use k3_engine::serve::validate::{ModelLimits, VocabCache, validate};
use k3_engine::serve::{Caller, Limits, Prompt, Request};
use k3_engine::session::file as session_file;
use k3_engine::synth::shape::Shape;
use k3_engine::synth::tokenizer_files::Vocab;
use k3_engine::tokenizer::Tokenizer;
use k3_engine::tokenizer::chat::{self, Conversation, Effort, Message, Role, Thinking};
use k3d::grpc::convert as grpc_body;
use k3d::http::anthropic::messages_body;
use k3d::http::body as http_body;
use k3proto::v1 as pb;
use prost::Message as _;
use sha2::{Digest, Sha256};

/// A target body: arbitrary bytes in, no panic out.
pub type Target = fn(&[u8]);

/// Every target by name: the name is its corpus directory and the driver's `K3_FUZZ_TARGET`.
pub const TARGETS: &[(&str, Target)] = &[
    ("safetensors_header", safetensors_header),
    ("safetensors_index", safetensors_index),
    ("config_json", config_json),
    ("tiktoken_model", tiktoken_model),
    ("tokenizer_config", tokenizer_config),
    ("session_file", session_file),
    ("chat_template", chat_template),
    ("chat_reply", chat_reply),
    ("grpc_request", grpc_request),
    ("http_request", http_request),
    ("pack_block", pack_block),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
}

thread_local! {
    /// A scratch directory private to this thread (tests run targets in parallel threads; a
    /// fuzzer runs one per process), made once and reused for every input, and removed when the
    /// thread ends.
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("k3-fuzz-")
        .tempdir()
        .expect("scratch directory for fuzz inputs");
}

fn scratch(file: &str) -> PathBuf {
    SCRATCH.with(|dir| dir.path().join(file))
}

fn write_scratch(file: &str, data: &[u8]) -> PathBuf {
    let path = scratch(file);
    fs::write(&path, data).expect("scratch file for a fuzz input");
    path
}

/// One shard's bytes (8-byte length, JSON header, data): validated as a file of exactly that
/// size, as `k3d check` validates each shard's header (spec §3.2).
pub fn safetensors_header(data: &[u8]) {
    let shard = (
        PathBuf::from("model-00001-of-00001.safetensors"),
        data.len() as u64,
        data.to_vec(),
    );
    let _ = TensorIndex::from_header_bytes(vec![shard]);
}

/// `model.safetensors.index.json` cross-checked against a fixed, valid two-shard index.
pub fn safetensors_index(data: &[u8]) {
    static INDEX: OnceLock<TensorIndex> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        let shard = |name: &str, tensors: &[(&str, Dtype, &[u64])]| {
            let specs: Vec<TensorSpec> = tensors
                .iter()
                .map(|&(n, dtype, shape)| TensorSpec {
                    name: n.into(),
                    dtype,
                    shape: shape.to_vec(),
                })
                .collect();
            let (header, data_len) = encode_header(&specs).expect("fixed header encodes");
            let size = header.len() as u64 + data_len;
            (PathBuf::from(name), size, header)
        };
        TensorIndex::from_header_bytes(vec![
            shard(
                "model-00001-of-00002.safetensors",
                &[
                    ("a.weight", Dtype::Bf16, &[2, 4]),
                    ("b.norm", Dtype::F32, &[4]),
                ],
            ),
            shard(
                "model-00002-of-00002.safetensors",
                &[("c.weight_packed", Dtype::U8, &[8])],
            ),
        ])
        .expect("fixed index is valid")
    });
    let path = write_scratch("model.safetensors.index.json", data);
    let _ = index.check_index_file(&path);
}

/// `config.json` (spec §2): any text, then every accessor a loaded config offers.
pub fn config_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = ModelConfig::from_json(text) {
        for l in 0..config.num_hidden_layers.min(4096) {
            let _ = config.is_moe_layer(l);
        }
    }
}

/// The `tiny` synthetic checkpoint's tokenizer files (`tiktoken.model`, `tokenizer_config.json`):
/// the valid counterpart of a fuzzed one. The committed `synth_tiny` seeds are these files, so
/// a seed mutated in one file still meets a partner it loads with.
pub fn valid_tokenizer_files() -> &'static (String, Vec<u8>) {
    static FILES: OnceLock<(String, Vec<u8>)> = OnceLock::new();
    FILES.get_or_init(|| {
        let tiny = Shape::named("tiny").expect("the tiny synthetic shape exists");
        let vocab = Vocab::learn(tiny.bpe_merges);
        let config = serde_json::to_vec(&vocab.tokenizer_config()).expect("config serialises");
        (vocab.tiktoken_model(), config)
    })
}

fn load_tokenizer(model: &[u8], config: &[u8]) -> Option<Tokenizer> {
    let model = write_scratch("tiktoken.model", model);
    let config = write_scratch("tokenizer_config.json", config);
    Tokenizer::from_files(&model, &config).ok()
}

/// A tokenizer that loads is used: every id decodes, and text round-trips through it.
fn exercise(tokenizer: &Tokenizer) {
    for id in 0..tokenizer.vocab_size().min(1 << 16) as u32 {
        let _ = tokenizer.decode(&[id]);
    }
    let text = "Hello, world! 123 <|im_end|>";
    for specials in [
        k3_engine::tokenizer::Specials::Plain,
        k3_engine::tokenizer::Specials::Recognised,
    ] {
        if let Ok(ids) = tokenizer.encode(text, specials) {
            let _ = tokenizer.decode_text(&ids);
        }
    }
}

/// `tiktoken.model` (spec §7.1) beside a valid `tokenizer_config.json`.
pub fn tiktoken_model(data: &[u8]) {
    let (_, config) = valid_tokenizer_files();
    if let Some(tokenizer) = load_tokenizer(data, config) {
        exercise(&tokenizer);
    }
}

/// `tokenizer_config.json` (spec §7.1) beside a valid `tiktoken.model`.
pub fn tokenizer_config(data: &[u8]) {
    let (model, _) = valid_tokenizer_files();
    if let Some(tokenizer) = load_tokenizer(model.as_bytes(), data) {
        exercise(&tokenizer);
    }
}

/// One block of the trunk pack's codec (`k3_engine::pack::block`), as the store decodes it
/// from a pack file: byte 0 is a mode byte, the rest is the block. The value count the caller
/// expects is the one the block's header claims (the index normally says it; a disagreement is
/// refused before anything else is read). With the mode byte odd the checksum is recomputed
/// first, so that the fuzzer reaches the checks behind it (code padding, exception order).
/// Every decode path the CPU has must agree — the same error or the same bytes — and what
/// decodes must encode and decode back to the same bytes.
pub fn pack_block(data: &[u8]) {
    use k3_engine::pack::block;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    let expected = match bytes.get(4..8) {
        Some(v) => u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize,
        None => 0,
    };
    if expected > block::MAX_VALUES {
        let mut out = Vec::new();
        assert!(
            block::decode(k3_engine::pack::Path::Portable, &bytes, expected, &mut out).is_err()
        );
        return;
    }
    if mode & 1 == 1
        && let Ok(end) = block::block_len(&bytes, expected)
    {
        let check = block::checksum(
            k3_engine::pack::Path::Portable,
            &[&bytes[..16], &bytes[block::HEADER..end]],
        );
        bytes[16..24].copy_from_slice(&check.to_le_bytes());
    }
    let mut results = k3_engine::pack::Path::all_supported()
        .into_iter()
        .map(|path| {
            let mut out = vec![0u8; 2 * expected];
            let r = block::decode(path, &bytes, expected, &mut out);
            (r, out)
        });
    let Some((first, decoded)) = results.next() else {
        return;
    };
    for (r, out) in results {
        assert_eq!(r, first, "decode paths disagree on the verdict");
        if r.is_ok() {
            assert!(out == decoded, "decode paths disagree on the bytes");
        }
    }
    if first.is_ok() {
        let mut again = Vec::new();
        block::encode(&decoded, &mut again);
        let mut back = vec![0u8; decoded.len()];
        let r = block::decode(k3_engine::pack::Path::Portable, &again, expected, &mut back);
        assert!(
            r.is_ok() && back == decoded,
            "a decoded block does not round-trip"
        );
    }
}

/// Session files (`*.k3s`): the listing reader and the full loader. With the first byte odd
/// the last 32 bytes are replaced by the checksum of the rest, so that the fuzzer reaches the
/// payload decoder behind the checksum.
pub fn session_file(data: &[u8]) {
    let Some(bytes) = session_file_bytes(data) else {
        return;
    };
    let path = write_scratch("fuzz.k3s", &bytes);
    if let Ok(header) = session_file::read_header(&path) {
        let _ = session_file::load(&path, &header.fingerprint);
    }
    let _ = session_file::load(&path, "fingerprint-of-another-model");
}

/// The session file a `session_file` input stands for: the input without its mode byte, with
/// the checksum fixed up when the mode byte is odd.
pub fn session_file_bytes(data: &[u8]) -> Option<Vec<u8>> {
    let (&mode, rest) = data.split_first()?;
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 && bytes.len() >= 32 {
        let body = bytes.len() - 32;
        let digest = Sha256::digest(&bytes[..body]);
        bytes[body..].copy_from_slice(&digest);
    }
    Some(bytes)
}

/// A small real tokenizer (the synthetic checkpoints') for the chat targets.
fn chat_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let (model, config) = valid_tokenizer_files();
        load_tokenizer(model.as_bytes(), config).expect("the synthetic tokenizer loads")
    })
}

/// The chat template renderer (spec §8.2): byte 0 picks thinking and the generation prompt,
/// then messages separated by 0xFF, each a role byte and `content 0xFE reasoning 0xFD name`.
pub fn chat_template(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let thinking = match flags % 5 {
        0 => Thinking::Off,
        1 => Thinking::On(None),
        2 => Thinking::On(Some(Effort::Low)),
        3 => Thinking::On(Some(Effort::High)),
        _ => Thinking::On(Some(Effort::Max)),
    };
    let messages = rest
        .split(|&b| b == 0xFF)
        .filter_map(|m| {
            let (&role, body) = m.split_first()?;
            let role = [Role::System, Role::User, Role::Assistant][role as usize % 3];
            let mut parts = body.split(|&b| b == 0xFE || b == 0xFD);
            let text = |p: Option<&[u8]>| p.map(|p| String::from_utf8_lossy(p).into_owned());
            let mut message = Message::new(role, text(parts.next()).unwrap_or_default());
            message.reasoning = text(parts.next());
            message.name = text(parts.next());
            Some(message)
        })
        .collect();
    let conversation = Conversation {
        messages,
        thinking,
        generation_prompt: flags & 0x80 != 0,
        ..Conversation::default()
    };
    let _ = chat::render(chat_tokenizer(), &conversation);
}

/// The reply parser (spec §8.4): byte 0 says whether the prompt opened the think channel, the
/// rest are little-endian u16 ids (any id, in range or not).
pub fn chat_reply(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let ids: Vec<u32> = rest
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    let _ = chat::parse_reply(chat_tokenizer(), &ids, flags & 1 == 1);
}

/// Decodes `data` as a `k3.v1` message; a message that decodes re-encodes to bytes that
/// decode to the same message (what the daemon acts on is what the client sent). "The same" is
/// compared as encoded bytes, not with `PartialEq`: a float field may hold NaN, which is not
/// equal to itself although it survives the round trip bit for bit.
fn decode_round_trip<M: prost::Message + Default>(data: &[u8]) {
    if let Ok(message) = M::decode(data) {
        let bytes = message.encode_to_vec();
        let again = M::decode(bytes.as_slice()).expect("an encoded message decodes");
        assert_eq!(again.encode_to_vec(), bytes, "re-decoded message differs");
    }
}

/// The gRPC request bodies of every `k3.v1` RPC. Byte 0 picks the message type. Each is
/// decoded (and must re-encode to itself); a `Generate` or `Chat` body then goes through the
/// daemon's own conversion (`daemon/k3d/src/grpc/convert.rs`) and what converts through the
/// serve core's validation, as the service does next.
pub fn grpc_request(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 9 {
        0 => {
            decode_round_trip::<pb::GenerateRequest>(body);
            if let Ok(req) = pb::GenerateRequest::decode(body)
                && let Ok(prompt) = grpc_body::prompt(req.prompt)
            {
                validates(grpc_body::request(prompt, req.options, req.session));
            }
        }
        1 => {
            decode_round_trip::<pb::ChatRequest>(body);
            if let Ok(req) = pb::ChatRequest::decode(body)
                && let Ok(conversation) = grpc_body::conversation(&req)
            {
                let prompt = Prompt::Chat(conversation);
                validates(grpc_body::request(prompt, req.options, req.session));
            }
        }
        2 => decode_round_trip::<pb::TokenizeRequest>(body),
        3 => decode_round_trip::<pb::DetokenizeRequest>(body),
        4 => decode_round_trip::<pb::StatusRequest>(body),
        5 => decode_round_trip::<pb::CancelRequest>(body),
        6 => decode_round_trip::<pb::ListSessionsRequest>(body),
        7 => decode_round_trip::<pb::DeleteSessionRequest>(body),
        _ => decode_round_trip::<pb::SaveSessionRequest>(body),
    }
}

/// HTTP request bodies — OpenAI's (`POST /v1/chat/completions` and `/v1/completions`) and
/// Anthropic's (`POST /v1/messages`) — through the daemon's own conversions
/// (`daemon/k3d/src/http/body.rs`, `http/anthropic/messages_body.rs`), and each request they accept
/// through the serve core's validation, which renders a chat with the template (spec §8.2) and
/// tokenises text. Every body is tried as all three: the bytes decide which parts accept it.
pub fn http_request(data: &[u8]) {
    http_request_reach(data);
}

/// How far `data` got as a chat body, a completion body and a messages body: `None` refused by
/// the conversion (or not a JSON object), `Some(false)` converted and refused by validation,
/// `Some(true)` accepted by both (the seeds are checked against this).
pub fn http_request_reach(data: &[u8]) -> [Option<bool>; 3] {
    let Ok(fields) = http_body::Fields::parse(data, Limits::default().max_prompt_tokens) else {
        return [None, None, None];
    };
    [
        http_body::chat(&fields)
            .ok()
            .map(|chat| validates(chat.request)),
        http_body::completion(&fields)
            .ok()
            .map(|completion| validates(completion.request)),
        messages_body::messages(&fields)
            .ok()
            .map(|parsed| validates(parsed.submission.request)),
    ]
}

/// The serve core's validation against the synthetic tokenizer, a 4096-token context and the
/// daemon's default limits.
fn validates(request: Request) -> bool {
    static VOCAB: OnceLock<VocabCache> = OnceLock::new();
    let tokenizer = chat_tokenizer();
    let model = ModelLimits {
        vocab_size: tokenizer.vocab_size(),
        context: 4096,
    };
    let vocab = VOCAB.get_or_init(VocabCache::default);
    validate(
        tokenizer,
        vocab,
        model,
        &Limits::default(),
        Caller::Unknown,
        request,
    )
    .is_ok()
}

/// Corpus directories of `target` under the repository's `fuzz/`: seeds, then regressions.
pub fn corpus_dirs(fuzz_dir: &Path, target: &str) -> [PathBuf; 2] {
    [
        fuzz_dir.join("corpus").join(target),
        fuzz_dir.join("regressions").join(target),
    ]
}
