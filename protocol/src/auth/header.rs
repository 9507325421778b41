//! The `Authorization` header's two forms (`Bearer` for programs, `Basic` for browsers) and
//! the base64 they need, so no dependency is pulled in for it.

use super::token::TOKEN_CHARS_MAX;

/// The token in an `Authorization` value: `Bearer <token>`, or `Basic base64(name:token)`
/// (browsers, for `/ui`; the name is ignored, the token file's name counts).
pub(super) fn presented_token(header: &str) -> Option<String> {
    if header.len() > TOKEN_CHARS_MAX * 2 {
        return None;
    }
    let (scheme, rest) = header.trim().split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = decode_base64(rest)?;
        let text = String::from_utf8(decoded).ok()?;
        let (_, token) = text.split_once(':')?;
        return Some(token.to_string());
    }
    None
}

/// Standard base64 with padding (what browsers send for Basic credentials).
pub(super) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (index, chunk) in bytes.chunks(4).enumerate() {
        let last = index == bytes.len() / 4 - 1;
        let padding = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 || (padding > 0 && !last) {
            return None;
        }
        let mut group = 0u32;
        for &c in &chunk[..4 - padding] {
            group = (group << 6) | value(c)?;
        }
        group <<= 6 * padding as u32;
        let produced = [(group >> 16) as u8, (group >> 8) as u8, group as u8];
        out.extend_from_slice(&produced[..3 - padding]);
    }
    Some(out)
}

/// The standard base64 of `bytes` (for clients building Basic credentials in tests).
pub fn encode_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let group = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((group >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
