//! `k3d tokenize` and `k3d detokenize`: the tokenizer on stdin/stdout, for scripts and checks.
//!
//! Contract: `tokenize` reads UTF-8 text and prints ids separated by single spaces and a final
//! newline (`--json`: one line `{"ids":[...]}`); added-token strings in the text stay text
//! unless `--specials`. `detokenize` reads ids separated by commas and/or whitespace and writes
//! exactly their bytes. Bad tokenizer files and bad input exit 2 with the line or position.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use k3_engine::tokenizer::{Specials, Tokenizer};

use crate::exit::{CliError, CliResult, Exit};

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// Directory holding `tiktoken.model` and `tokenizer_config.json`.
    #[arg(long)]
    tok: PathBuf,
    /// Print `{"ids":[...]}` instead of space-separated ids.
    #[arg(long)]
    json: bool,
    /// Turn added-token strings such as `<|open|>` in the text into their ids.
    #[arg(long)]
    specials: bool,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    /// Directory holding `tiktoken.model` and `tokenizer_config.json`.
    #[arg(long)]
    tok: PathBuf,
}

fn usage(error: impl Into<anyhow::Error>) -> CliError {
    CliError::new(Exit::Usage, error)
}

/// Malformed tokenizer files are a checkpoint error (exit 3), like every other file of the
/// checkpoint; bad input on stdin is a usage error (exit 2).
fn load(dir: &Path) -> Result<Tokenizer, CliError> {
    Tokenizer::load(dir).map_err(|e| CliError::new(Exit::Checkpoint, e))
}

fn read_stdin() -> Result<Vec<u8>, CliError> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("reading stdin")?;
    Ok(input)
}

fn write_stdout(bytes: &[u8]) -> CliResult {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .context("writing stdout")?;
    Ok(())
}

pub fn tokenize(args: TokenizeArgs) -> CliResult {
    let tokenizer = load(&args.tok)?;
    let input = read_stdin()?;
    let text = std::str::from_utf8(&input).map_err(|e| {
        usage(anyhow!(
            "stdin is not valid UTF-8: invalid byte at offset {}",
            e.valid_up_to()
        ))
    })?;
    let specials = if args.specials {
        Specials::Recognised
    } else {
        Specials::Plain
    };
    let ids = tokenizer.encode(text, specials).map_err(usage)?;
    let mut line = if args.json {
        serde_json::json!({ "ids": ids }).to_string()
    } else {
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
    };
    line.push('\n');
    write_stdout(line.as_bytes())
}

/// Parses ids separated by commas and/or whitespace; errors name the byte offset.
fn parse_ids(input: &[u8]) -> Result<Vec<u32>, CliError> {
    let mut ids = Vec::new();
    let mut offset = 0;
    for field in input.split(|&b| b == b',' || b.is_ascii_whitespace()) {
        if !field.is_empty() {
            let id = std::str::from_utf8(field)
                .ok()
                .and_then(|f| f.parse::<u32>().ok())
                .ok_or_else(|| {
                    usage(anyhow!(
                        "stdin offset {offset}: {:?} is not a token id",
                        String::from_utf8_lossy(field)
                    ))
                })?;
            ids.push(id);
        }
        offset += field.len() + 1;
    }
    Ok(ids)
}

pub fn detokenize(args: DetokenizeArgs) -> CliResult {
    let tokenizer = load(&args.tok)?;
    let ids = parse_ids(&read_stdin()?)?;
    let bytes = tokenizer.decode(&ids).map_err(usage)?;
    write_stdout(&bytes)
}
