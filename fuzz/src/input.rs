//! A tiny byte format shared by the harnesses and the seed generator: little-endian integers
//! and length-prefixed byte strings, read leniently (missing bytes read as zeros, so every input
//! means something) and written exactly (so seeds are made from the code, not by hand).

/// Reads fields off the fuzzer's input; past the end everything reads as zero or empty.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    pub fn u16(&mut self) -> u16 {
        let mut word = [0u8; 2];
        let taken = self.take(2);
        word[..taken.len()].copy_from_slice(taken);
        u16::from_le_bytes(word)
    }

    pub fn u32(&mut self) -> u32 {
        let mut word = [0u8; 4];
        let taken = self.take(4);
        word[..taken.len()].copy_from_slice(taken);
        u32::from_le_bytes(word)
    }

    pub fn u64(&mut self) -> u64 {
        let mut word = [0u8; 8];
        let taken = self.take(8);
        word[..taken.len()].copy_from_slice(taken);
        u64::from_le_bytes(word)
    }

    /// A `u16` length, then that many bytes (fewer if the input ends).
    pub fn bytes(&mut self) -> &'a [u8] {
        let len = self.u16() as usize;
        self.take(len)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.take(self.bytes.len())
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.bytes.len());
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        taken
    }
}

/// Writes what [`Reader`] reads.
#[derive(Debug, Default)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }

    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Panics (seed generation only) on more than `u16::MAX` bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u16::try_from(v.len()).expect("a seed field over 64 KiB");
        self.u16(len);
        self.bytes.extend_from_slice(v);
        self
    }

    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(v);
        self
    }
}
