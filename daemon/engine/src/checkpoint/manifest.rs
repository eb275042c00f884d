//! SHA-256 manifests of a checkpoint directory in `sha256sum` format: one `<64 hex>  <name>`
//! line per file (`<hex> *<name>` from binary mode is accepted too), names relative to the
//! manifest's directory. `sha256sum -c SHA256SUMS` checks the same file.

/// The default manifest file name inside a model directory.
pub const DEFAULT_NAME: &str = "SHA256SUMS";

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}:{line}: expected `<64 hex digits>  <file name>`, found {text:?}")]
    Syntax {
        file: String,
        line: usize,
        text: String,
    },
    #[error(
        "{file}:{line}: file name {name:?} is not a plain relative path inside the model directory"
    )]
    BadName {
        file: String,
        line: usize,
        name: String,
    },
    #[error("{file}:{line}: {name} is listed twice (first on line {first})")]
    Duplicate {
        file: String,
        line: usize,
        first: usize,
        name: String,
    },
}

/// One listed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub sha256: [u8; 32],
}

/// A parsed manifest, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

/// Lower-case hex of a digest, as `sha256sum` prints it.
pub fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest a 64-digit hex string spells (either case), if it is one.
pub fn parse_hex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A name may not escape the directory: no absolute paths, no `..`, no empty components.
fn plain_relative(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

impl Manifest {
    /// Parse manifest text; `file` names it in errors. Blank lines are ignored.
    pub fn parse(file: &str, text: &str) -> Result<Manifest, ManifestError> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut lines_of: Vec<usize> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let syntax = || ManifestError::Syntax {
                file: file.to_string(),
                line,
                text: raw.to_string(),
            };
            let (digest, rest) = raw.split_once(' ').ok_or_else(syntax)?;
            let name = rest
                .strip_prefix(' ')
                .or_else(|| rest.strip_prefix('*'))
                .ok_or_else(syntax)?;
            let sha256 = parse_hex(digest).ok_or_else(syntax)?;
            let name = name.strip_prefix("./").unwrap_or(name);
            if !plain_relative(name) {
                return Err(ManifestError::BadName {
                    file: file.to_string(),
                    line,
                    name: name.to_string(),
                });
            }
            if let Some(j) = entries.iter().position(|e| e.name == name) {
                return Err(ManifestError::Duplicate {
                    file: file.to_string(),
                    line,
                    first: lines_of.get(j).copied().unwrap_or(0),
                    name: name.to_string(),
                });
            }
            entries.push(Entry {
                name: name.to_string(),
                sha256,
            });
            lines_of.push(line);
        }
        Ok(Manifest { entries })
    }

    /// The manifest in `sha256sum` text format.
    pub fn to_text(&self) -> String {
        self.entries
            .iter()
            .map(|e| format!("{}  {}\n", hex(&e.sha256), e.name))
            .collect()
    }

    /// The entry for `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn round_trip_and_binary_marker() {
        let text = format!("{A}  config.json\n\n{A} *./model-00001-of-000002.safetensors\n");
        let m = Manifest::parse("SUMS", &text).unwrap();
        assert_eq!(m.entries.len(), 2);
        assert_eq!(m.entries[1].name, "model-00001-of-000002.safetensors");
        assert_eq!(hex(&m.entries[0].sha256), A);
        assert_eq!(
            m.to_text(),
            format!("{A}  config.json\n{A}  model-00001-of-000002.safetensors\n")
        );
    }

    #[test]
    fn refusals_name_the_line() {
        let bad = |t: &str| Manifest::parse("SUMS", t).unwrap_err().to_string();
        assert!(bad("abc  x\n").contains("SUMS:1:"));
        assert!(bad(&format!("{A}\tx\n")).contains("SUMS:1:"));
        assert!(bad(&format!("{A}  ../etc/passwd\n")).contains("not a plain relative path"));
        assert!(bad(&format!("{A}  /etc/passwd\n")).contains("not a plain relative path"));
        assert!(
            bad(&format!("{A}  x\n{A}  x\n"))
                .contains("SUMS:2: x is listed twice (first on line 1)")
        );
    }
}
