//! Parity with an independent implementation (Python tiktoken 0.14.0 with the K3 pattern, ids
//! committed by `tests/tokenizer/gen_fixtures.py`) on real large vocabularies, byte-exact round
//! trips, the long-run guards, and streaming detokenisation over the same corpus.

mod tokenizer_support;

use std::sync::OnceLock;

use k3_engine::tokenizer::{Specials, StreamDecoder, Tokenizer};
use sha2::{Digest, Sha256};
use tokenizer_support::{fixtures, read_ids, tiktoken_asset};

fn load(vocab: &str) -> Tokenizer {
    Tokenizer::from_files(
        &tiktoken_asset(&format!("{vocab}_base.tiktoken")),
        &fixtures().join(vocab).join("tokenizer_config.json"),
    )
    .unwrap_or_else(|e| panic!("loading {vocab}: {e}"))
}

fn o200k() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("o200k"))
}

fn cl100k() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("cl100k"))
}

fn corpus(vocab: &str) -> String {
    let text = std::fs::read_to_string(fixtures().join(vocab).join("corpus.txt")).expect("corpus");
    assert!(text.len() >= 50_000, "corpus must be at least 50 KB");
    text
}

/// Compares id lists, reporting the first difference with context instead of two huge dumps.
fn assert_same_ids(ours: &[u32], oracle: &[u32], what: &str) {
    if let Some(i) = (0..ours.len().min(oracle.len())).find(|&i| ours[i] != oracle[i]) {
        let lo = i.saturating_sub(5);
        panic!(
            "{what}: first difference at id {i}: ours {:?} vs tiktoken {:?}",
            &ours[lo..(i + 5).min(ours.len())],
            &oracle[lo..(i + 5).min(oracle.len())]
        );
    }
    assert_eq!(ours.len(), oracle.len(), "{what}: id counts differ");
}

fn parity(vocab: &str, tokenizer: &Tokenizer) {
    let text = corpus(vocab);
    for (mode, specials) in [
        ("plain", Specials::Plain),
        ("specials", Specials::Recognised),
    ] {
        let oracle = read_ids(&fixtures().join(vocab).join(format!("corpus.{mode}.ids")));
        let ours = tokenizer.encode(&text, specials).expect("encode");
        assert_same_ids(&ours, &oracle, &format!("{vocab} {mode}"));
        assert_eq!(
            tokenizer.decode(&ours).expect("decode"),
            text.as_bytes(),
            "{vocab} {mode}: round trip"
        );
    }
    // The corpus spells added tokens as text; recognising them must change the ids.
    let plain = tokenizer.encode(&text, Specials::Plain).expect("encode");
    let first_added = tokenizer.rank_count() as u32;
    assert!(plain.iter().all(|&id| id < first_added));
    let recognised = tokenizer
        .encode(&text, Specials::Recognised)
        .expect("encode");
    assert!(recognised.iter().any(|&id| id >= first_added));
}

#[test]
fn o200k_corpus_matches_tiktoken() {
    parity("o200k", o200k());
}

#[test]
fn cl100k_corpus_matches_tiktoken() {
    parity("cl100k", cl100k());
}

fn long_runs(vocab: &str, tokenizer: &Tokenizer) {
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(vocab).join("long_runs.json")).expect("cases"),
    )
    .expect("JSON");
    let cases = cases.as_object().expect("object");
    assert!(cases.len() >= 7);
    for (name, case) in cases {
        let text: String = case["recipe"]
            .as_array()
            .expect("recipe")
            .iter()
            .map(|part| {
                part[0]
                    .as_str()
                    .expect("s")
                    .repeat(part[1].as_u64().expect("n") as usize)
            })
            .collect();
        let ids = tokenizer.encode(&text, Specials::Plain).expect("encode");
        let head: Vec<u32> = serde_json::from_value(case["head"].clone()).expect("head");
        let tail: Vec<u32> = serde_json::from_value(case["tail"].clone()).expect("tail");
        assert_eq!(
            &ids[..head.len().min(ids.len())],
            head,
            "{vocab} {name}: head"
        );
        assert_eq!(
            &ids[ids.len().saturating_sub(tail.len())..],
            tail,
            "{vocab} {name}: tail"
        );
        assert_eq!(
            ids.len() as u64,
            case["count"].as_u64().expect("count"),
            "{vocab} {name}"
        );
        let joined = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
        let digest: String = Sha256::digest(joined.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            digest,
            case["sha256"].as_str().expect("sha"),
            "{vocab} {name}"
        );
        assert_eq!(tokenizer.decode(&ids).expect("decode"), text.as_bytes());
    }
}

/// Runs > 25,000 characters and text > 400,000 characters: pins `cap_runs` and the pieces.
#[test]
fn long_runs_match_tiktoken_with_the_spec_guards() {
    long_runs("o200k", o200k());
    long_runs("cl100k", cl100k());
}

#[test]
fn streaming_decode_emits_only_complete_utf8() {
    let tokenizer = o200k();
    let text = corpus("o200k");
    let ids = tokenizer.encode(&text, Specials::Plain).expect("encode");
    // o200k splits many CJK and emoji characters across ids, so holding back is exercised.
    let split_chars = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(tokenizer.token_bytes(id).expect("id")).is_err())
        .count();
    assert!(
        split_chars > 100,
        "corpus should split characters across ids"
    );
    let mut stream = StreamDecoder::new(tokenizer);
    let mut out = String::new();
    for &id in &ids {
        let piece = stream.push(id).expect("push");
        assert!(!piece.contains('\u{fffd}'), "a broken character was shown");
        out.push_str(&piece);
    }
    out.push_str(&stream.flush());
    assert_eq!(out, text);
}

#[test]
fn streaming_decode_replaces_invalid_bytes_like_lossy_decoding() {
    let tokenizer = o200k();
    let byte = |b: u8| {
        (0..tokenizer.rank_count() as u32)
            .find(|&id| tokenizer.token_bytes(id) == Some(&[b][..]))
            .expect("every single byte is a token")
    };
    // "a", a 3-byte lead with one continuation, "b" (invalid: replaced), then a lone 0xff,
    // then a held incomplete sequence at the end (replaced on flush).
    let ids: Vec<u32> = [b'a', 0xe4, 0xb8, b'b', 0xff, b'c', 0xf0, 0x9f]
        .into_iter()
        .map(byte)
        .collect();
    let mut stream = StreamDecoder::new(tokenizer);
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(stream.push(id).expect("push"));
    }
    let held = stream.flush();
    let whole = String::from_utf8_lossy(&tokenizer.decode(&ids).expect("decode")).into_owned();
    assert_eq!(pieces.concat() + &held, whole);
    assert_eq!(pieces, ["a", "", "", "\u{fffd}b", "\u{fffd}", "c", "", ""]);
    assert_eq!(held, "\u{fffd}");
    assert!(stream.push(u32::MAX).is_err());
}
