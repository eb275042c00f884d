//! Quoting a caller's text in error messages, bounded: every error that repeats input (a
//! session name, a tool-call id, an HTTP field) formats it through [`Echo`], and transports cut
//! whole messages with [`bounded`]. It sits at the bottom of the crate, beside
//! [`crate::input_file`], because the tokenizer's chat template, the session store and the serve
//! core all quote what they refuse.

/// Most bytes of a caller's text an error message repeats. Errors quote what they refuse, but a
/// 100 KB session name quoted whole overflows a gRPC reply's metadata (its message travels in a
/// header) and turns a refusal into a transport failure.
pub const ECHO_BYTES: usize = 64;

/// A caller's text as an error message quotes it: in quotes (escaped as `{:?}` escapes), and
/// beyond [`ECHO_BYTES`] cut at a character boundary, with an ellipsis and the full length.
/// Every error that repeats input formats it through this, so every transport's messages stay
/// bounded.
#[derive(Debug, Clone, Copy)]
pub struct Echo<'a>(pub &'a str);

impl std::fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0;
        if text.len() <= ECHO_BYTES {
            return write!(f, "{text:?}");
        }
        let cut = (0..=ECHO_BYTES)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        write!(f, "{:?}… ({} bytes)", &text[..cut], text.len())
    }
}

/// Longest error message a transport sends, in bytes: a backstop for messages that embed
/// text this crate does not format (a JSON parser's "invalid type: string …").
pub const MESSAGE_BYTES: usize = 1024;

/// `message` cut to [`MESSAGE_BYTES`] at a character boundary, with an ellipsis and the full
/// length when it was longer.
pub fn bounded(message: String) -> String {
    if message.len() <= MESSAGE_BYTES {
        return message;
    }
    let cut = (0..=MESSAGE_BYTES)
        .rev()
        .find(|&i| message.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}… ({} bytes)", &message[..cut], message.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole() {
        assert_eq!(Echo("chat-1").to_string(), "\"chat-1\"");
        assert_eq!(Echo("").to_string(), "\"\"");
    }

    #[test]
    fn long_input_is_cut_with_an_ellipsis_and_its_length() {
        let name = "n".repeat(100_000);
        let shown = Echo(&name).to_string();
        assert!(shown.len() < ECHO_BYTES + 32, "{shown}");
        assert!(
            shown.starts_with(&format!("\"{}", "n".repeat(ECHO_BYTES))),
            "{shown}"
        );
        assert!(shown.ends_with("… (100000 bytes)"), "{shown}");
    }

    #[test]
    fn the_cut_falls_on_a_character_boundary() {
        // 'é' is 2 bytes: byte ECHO_BYTES falls inside the 33rd one.
        let text = format!("a{}", "é".repeat(100));
        let shown = Echo(&text).to_string();
        assert!(shown.contains("… (201 bytes)"), "{shown}");
        assert_eq!(
            bounded("é".repeat(MESSAGE_BYTES))
                .chars()
                .filter(|&c| c == 'é')
                .count(),
            MESSAGE_BYTES / 2
        );
    }

    #[test]
    fn messages_are_bounded_whole() {
        assert_eq!(bounded("short".into()), "short");
        let long = bounded("x".repeat(5000));
        assert!(
            long.len() < MESSAGE_BYTES + 32 && long.ends_with("… (5000 bytes)"),
            "{long}"
        );
    }
}
