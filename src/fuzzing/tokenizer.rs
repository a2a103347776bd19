//! Fuzz entry point `tokenizer`: bytes as a `tokenizer.json` -> `Tokenizer::from_bytes`, then
//! every query the engine makes of a loaded tokenizer (vocabulary size, fingerprint, special
//! tokens, id <-> token), and encode -> decode -> streaming detokenisation of fixed texts (valid
//! UTF-8 of 1 to 4 bytes per character, special-token spellings, and invalid UTF-8 turned into
//! U+FFFD the way a lossy caller would) plus ids taken from the input itself.

use crate::error::{Error, Result};
use crate::tokenizer::{StreamDecoder, Tokenizer};

const TEXTS: &[&[u8]] = &[
    b"hello world",
    b"<think>2+2=4</think> done<eos>",
    "h\u{e9}llo w\u{f6}rld \u{4e16}\u{754c} \u{1f980}".as_bytes(),
    b"\xff\xfe broken \xc3( \xe2\x82 utf-8 \xf0\x9f\x98",
    b"",
    b"  \t\n  ",
];

/// See the module doc.
pub fn tokenizer(data: &[u8]) -> Result<()> {
    let tok = Tokenizer::from_bytes(data)?;
    let vocab = tok.vocab_size();
    let _ = (tok.vocab_fingerprint(), tok.special_token_ids());
    let _ = (tok.token_to_id("<think>"), tok.token_to_id(""));
    let probe = [0, 1, vocab.saturating_sub(1), vocab, u32::MAX as usize];
    for id in probe {
        let _ = tok.id_to_token(id as u32);
    }
    let mut first_err = None;
    for text in TEXTS {
        let text = String::from_utf8_lossy(text);
        for add_special in [false, true] {
            match tok.encode(&text, add_special) {
                Ok(ids) => round_trip(&tok, &ids)?,
                Err(e @ Error::Tokenizer(_)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
    }
    // ids from the input's tail (in range most of the time, a few beyond it)
    let ids: Vec<u32> = data
        .iter()
        .rev()
        .take(16)
        .map(|&b| b as u32 % (vocab as u32).saturating_add(2).max(1))
        .collect();
    round_trip(&tok, &ids)?;
    first_err.map_or(Ok(()), Err)
}

/// Decode both ways and stream `ids`; unknown ids must be refused as such.
fn round_trip(tok: &Tokenizer, ids: &[u32]) -> Result<()> {
    let known = tok.check_ids(ids).is_ok();
    for skip in [false, true] {
        match tok.decode(ids, skip) {
            Ok(_) => assert!(known, "decode accepted an id check_ids refuses"),
            Err(Error::UnknownToken { .. }) => assert!(!known),
            Err(Error::Tokenizer(_)) => {}
            Err(e) => return Err(e),
        }
        let mut stream = StreamDecoder::new(skip);
        for &id in ids {
            match stream.push(tok, id) {
                Ok(_) | Err(Error::UnknownToken { .. }) | Err(Error::Tokenizer(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let before = stream.emitted().len();
        match stream.finish(tok) {
            Ok(delta) => assert_eq!(stream.emitted().len(), before + delta.len()),
            Err(Error::Tokenizer(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
