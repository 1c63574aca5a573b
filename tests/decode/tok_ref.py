"""Reference token ids from Hugging Face `tokenizers` for tests/decode/test_tokenizer_model.c.

    tok_ref.py MODEL.gguf WORKDIR

Reads the vocabulary, token types and merges of a byte-level BPE GGUF file (a small reader below;
no gguf package needed), and for each pre-tokenizer the C tokenizer implements writes
WORKDIR/<pre>/tokenizer.json with that vocabulary:

    smollm  Sequence[Digits(individual_digits), ByteLevel(use_regex)]   (SmolLM2's own config)
    gpt2    ByteLevel(use_regex)
    llama3  Sequence[Split(Llama-3 regex, Isolated), ByteLevel(use_regex=false)], ignore_merges
    qwen2   Sequence[Split(Qwen2 regex, Isolated), ByteLevel(use_regex=false)]

CONTROL tokens become special added tokens, USER_DEFINED ones non-special added tokens, as
llama.cpp treats them. Every WORKDIR/text_*.txt (UTF-8) is then encoded by `tokenizers` with each
file, without special-token post-processing, and the ids are written one text per line, in
sorted file-name order, to WORKDIR/<pre>.ref. The C test loads the same tokenizer.json files
(and the GGUF itself) and compares token for token.
"""
import glob
import json
import os
import struct
import sys

from tokenizers import Tokenizer

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")


def read_gguf_meta(path):
    """The metadata key/values of a GGUF v2/v3 file (tensor infos are not needed)."""
    scal = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    with open(path, 'rb') as f:
        def rd(fmt):
            return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))[0]

        def rstr():
            return f.read(rd('Q')).decode('utf-8')

        def rval(t):
            if t in scal:
                return rd(scal[t])
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd('I'), rd('Q')
                return [rval(et) for _ in range(n)]
            raise ValueError('gguf value type %d' % t)

        if f.read(4) != b'GGUF':
            raise ValueError('%s: not a GGUF file' % path)
        version, _, nkv = rd('I'), rd('Q'), rd('Q')
        if version not in (2, 3):
            raise ValueError('%s: GGUF version %d' % (path, version))
        kv = {}
        for _ in range(nkv):
            k = rstr()
            kv[k] = rval(rd('I'))
        return kv


def byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def pre_tokenizer(name):
    if name == 'smollm':
        return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                      byte_level(True)]}
    if name == 'gpt2':
        return byte_level(True)
    pattern = LLAMA3 if name == 'llama3' else QWEN2
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        byte_level(False)]}


def tokenizer_json(kv, name):
    tokens = kv['tokenizer.ggml.tokens']
    types = kv.get('tokenizer.ggml.token_type', [1] * len(tokens))
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise ValueError('token %r stored twice (%d, %d)' % (t, vocab[t], i))
        vocab[t] = i
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3}
             for i, t in enumerate(tokens) if types[i] in (3, 4)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre_tokenizer(name), "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": name == 'llama3', "vocab": vocab,
                  "merges": kv['tokenizer.ggml.merges']},
    }


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    gguf, work = sys.argv[1], sys.argv[2]
    kv = read_gguf_meta(gguf)
    if kv.get('tokenizer.ggml.model') != 'gpt2':
        sys.exit('%s: tokenizer.ggml.model %r is not byte-level BPE' % (gguf, kv.get('tokenizer.ggml.model')))
    texts = []
    for path in sorted(glob.glob(os.path.join(work, 'text_*.txt'))):
        with open(path, 'rb') as f:
            texts.append(f.read().decode('utf-8'))
    for name in ('smollm', 'gpt2', 'llama3', 'qwen2'):
        os.makedirs(os.path.join(work, name), exist_ok=True)
        jpath = os.path.join(work, name, 'tokenizer.json')
        with open(jpath, 'w', encoding='utf-8') as f:
            json.dump(tokenizer_json(kv, name), f, ensure_ascii=False)
        tok = Tokenizer.from_file(jpath)
        with open(os.path.join(work, name + '.ref'), 'w') as f:
            for text in texts:
                ids = tok.encode(text, add_special_tokens=False).ids
                if tok.decode(ids, skip_special_tokens=False) != text:
                    sys.exit('reference %s does not round-trip a text' % name)
                f.write(' '.join(map(str, ids)) + '\n')
    print('tok_ref: %d texts, 4 pre-tokenizers, vocab %d' % (len(texts), len(kv['tokenizer.ggml.tokens'])))


if __name__ == '__main__':
    main()
