//! Loading `tiktoken.model` / `tokenizer_config.json`: any rank count, reserved-slot naming,
//! specials by name, and one test per malformed-input case (each error names where it is).

mod tokenizer_support;

use std::path::{Path, PathBuf};

use k3_engine::tokenizer::{Specials, Tokenizer, TokenizerError};
use tokenizer_support::{fixtures, scratch};

fn tiny_dir() -> PathBuf {
    fixtures().join("tiny")
}

fn tiny() -> Tokenizer {
    Tokenizer::load(&tiny_dir()).expect("tiny tokenizer")
}

fn model_lines() -> Vec<String> {
    std::fs::read_to_string(tiny_dir().join("tiktoken.model"))
        .expect("tiny model")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A copy of the tiny tokenizer with `edit` applied to its model lines, loaded.
fn load_edited(
    test: &str,
    edit: impl FnOnce(&mut Vec<String>),
) -> Result<Tokenizer, TokenizerError> {
    let tmp = scratch(test);
    let dir = tmp.path();
    let mut lines = model_lines();
    edit(&mut lines);
    std::fs::write(dir.join("tiktoken.model"), lines.join("\n") + "\n").expect("write");
    std::fs::copy(
        tiny_dir().join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .expect("copy");
    Tokenizer::load(dir)
}

fn load_with_config(test: &str, config: &str) -> Result<Tokenizer, TokenizerError> {
    let tmp = scratch(test);
    let dir = tmp.path();
    std::fs::copy(
        tiny_dir().join("tiktoken.model"),
        dir.join("tiktoken.model"),
    )
    .expect("copy");
    std::fs::write(dir.join("tokenizer_config.json"), config).expect("write");
    Tokenizer::load(dir)
}

fn message(result: Result<Tokenizer, TokenizerError>) -> (TokenizerError, String) {
    match result {
        Ok(_) => panic!("expected a load error"),
        Err(e) => {
            let text = e.to_string();
            (e, text)
        }
    }
}

#[test]
fn tiny_vocab_places_added_slots_after_its_ranks() {
    let t = tiny();
    let n = model_lines().len() as u32;
    assert_eq!(t.rank_count() as u32, n);
    assert_eq!(t.vocab_size() as u32, n + 256);
    assert_eq!(t.special_id("[BOS]"), Some(n));
    assert_eq!(t.end_of_turn_ids(), [n + 2, n + 1]);
    assert_eq!(t.special_id("<|open|>"), Some(n + 3));
    assert_eq!(t.special_id("[PAD]"), Some(n + 255));
    // Unnamed slots are reserved tokens named by id, and encode to that id.
    let reserved = format!("<|reserved_token_{}|>", n + 8);
    assert_eq!(t.special_id(&reserved), Some(n + 8));
    assert_eq!(t.token_bytes(n + 8), Some(reserved.as_bytes()));
    assert_eq!(t.encode(&reserved, Specials::Recognised).unwrap(), [n + 8]);
    assert!(
        t.encode(&reserved, Specials::Plain)
            .unwrap()
            .iter()
            .all(|&id| id < n)
    );
    assert_eq!(t.token_bytes(n + 256), None);
    assert!(t.decode(&[0, n + 256]).is_err());
}

#[test]
fn whole_piece_fast_path_and_merges() {
    let t = tiny();
    let rank = |s: &[u8]| {
        (0..t.rank_count() as u32)
            .find(|&id| t.token_bytes(id) == Some(s))
            .unwrap()
    };
    // "hello" and " world" are tokens; "hellohello" merges from bytes.
    assert_eq!(
        t.encode("hello world", Specials::Plain).unwrap(),
        [rank(b"hello"), rank(b" world")]
    );
    assert_eq!(
        t.encode("hellohello", Specials::Plain).unwrap(),
        [rank(b"hello"), rank(b"hello")]
    );
    assert_eq!(
        t.encode("中", Specials::Plain).unwrap(),
        [rank("中".as_bytes())]
    );
    assert_eq!(t.encode("", Specials::Plain).unwrap(), Vec::<u32>::new());
    // "xyz" is a token with no two-byte part: merging alone would leave three bytes.
    assert_eq!(t.encode("xyz", Specials::Plain).unwrap(), [rank(b"xyz")]);
    let bytes: Vec<u32> = b" xyz".iter().map(|b| rank(&[*b])).collect();
    assert_eq!(t.encode(" xyz", Specials::Plain).unwrap(), bytes);
}

#[test]
fn crlf_and_blank_lines_are_tolerated() {
    let tmp = scratch("crlf");
    let dir = tmp.path();
    let text = model_lines().join("\r\n\r\n") + "\r\n\n";
    std::fs::write(dir.join("tiktoken.model"), text).unwrap();
    std::fs::copy(
        tiny_dir().join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let t = Tokenizer::load(dir).expect("CRLF file");
    assert_eq!(t.rank_count(), model_lines().len());
}

/// Replaces model line `line` (1-based); the load error must name that line.
fn line_error(test: &str, line: usize, replacement: &str) -> String {
    let (e, text) = message(load_edited(test, |l| l[line - 1] = replacement.into()));
    assert!(
        matches!(e, TokenizerError::ModelLine { line: l, .. } if l == line),
        "{text}"
    );
    assert!(text.contains(&format!("tiktoken.model:{line}: ")), "{text}");
    text
}

#[test]
fn bad_base64_names_the_line() {
    assert!(line_error("b64", 5, "!!!* 4").contains(":5: bad base64"));
}

#[test]
fn missing_rank_names_the_line() {
    assert!(line_error("norank", 3, "Iw==").contains(":3: missing rank"));
}

#[test]
fn unparsable_rank_names_the_line() {
    assert!(line_error("badrank", 7, "Jw== seven").contains("\"seven\" is not a number"));
}

#[test]
fn duplicate_rank_names_both_lines() {
    // Line 10 claims rank 3, which line 4 already has.
    let (e, text) = message(load_edited("duprank", |l| {
        let token = l[9].split(' ').next().unwrap().to_owned();
        l[9] = format!("{token} 3");
    }));
    assert!(
        matches!(
            e,
            TokenizerError::DuplicateRank {
                line: 10,
                rank: 3,
                first_line: 4,
                ..
            }
        ),
        "{text}"
    );
}

#[test]
fn non_contiguous_ranks_name_the_line() {
    let (e, text) = message(load_edited("gap", |l| {
        let last = l.len() - 1;
        let token = l[last].split(' ').next().unwrap().to_owned();
        l[last] = format!("{token} 999");
    }));
    let line = model_lines().len();
    assert!(
        matches!(e, TokenizerError::RanksNotContiguous { rank: 999, line: l, .. } if l == line),
        "{text}"
    );
}

#[test]
fn duplicate_token_bytes_are_rejected() {
    let (e, text) = message(load_edited("duptoken", |l| {
        let n = l.len();
        l.push(format!("{} {n}", l[0].split(' ').next().unwrap()));
    }));
    assert!(
        matches!(e, TokenizerError::DuplicateToken { first_rank: 0, .. }),
        "{text}"
    );
}

#[test]
fn a_missing_single_byte_is_rejected() {
    // Remove rank 0 ("!") and renumber the rest so the ranks stay contiguous.
    let (e, text) = message(load_edited("nobyte", |l| {
        l.remove(0);
        for (rank, line) in l.iter_mut().enumerate() {
            let token = line.split(' ').next().unwrap().to_owned();
            *line = format!("{token} {rank}");
        }
    }));
    assert!(
        matches!(e, TokenizerError::MissingByte { byte: b'!', .. }),
        "{text}"
    );
}

#[test]
fn added_id_outside_the_slots_is_rejected() {
    let n = model_lines().len();
    let config = format!(
        r#"{{"added_tokens_decoder": {{"{}": {{"content": "[X]", "special": true}}}}}}"#,
        n + 256
    );
    let (e, text) = message(load_with_config("addedrange", &config));
    assert!(
        matches!(e, TokenizerError::AddedIdOutOfRange { .. }),
        "{text}"
    );
    assert!(text.contains(&format!("\"{}\"", n + 256)), "{text}");
    let config = r#"{"added_tokens_decoder": {"12": {"content": "[X]"}}}"#;
    let (e, _) = message(load_with_config("addedlow", config));
    assert!(matches!(
        e,
        TokenizerError::AddedIdOutOfRange { id: 12, .. }
    ));
}

#[test]
fn config_without_control_tokens_is_rejected() {
    let n = model_lines().len();
    let config = format!(r#"{{"added_tokens_decoder": {{"{n}": {{"content": "[BOS]"}}}}}}"#);
    let (e, text) = message(load_with_config("nocontrol", &config));
    assert!(
        matches!(
            e,
            TokenizerError::MissingControlToken {
                name: "<|open|>",
                ..
            }
        ),
        "{text}"
    );
}

#[test]
fn missing_files_name_the_path() {
    let (e, text) = message(Tokenizer::load(Path::new("/nonexistent/k3-tok")));
    assert!(matches!(e, TokenizerError::Io { .. }));
    assert!(
        text.contains("/nonexistent/k3-tok/tiktoken.model"),
        "{text}"
    );
}
