"""Multi-turn reuse: a prompt that extends a finished conversation starts from
that conversation's KV (reported as cached_tokens) and gives the same output
as a server that computes it from scratch.

The prefix cache shares prompt KV in blocks, the last one of a prompt in
part: a follow-up reuses all of the earlier prompt, and at least one token
is always computed (the logits of the last prompt token)."""
from conftest import TINY_GGUF


def turn(client, messages, n=24):
    r = client.chat.completions.create(model="x", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content, r.usage


def test_second_turn_reuses_the_first_turns_kv(augur_server):
    warm = augur_server(TINY_GGUF, "--parallel", "2")
    first = [{"role": "user", "content": "Once upon a time there was a little dog named Max."}]
    reply, u1 = turn(warm.client(), first)
    assert u1.prompt_tokens_details.cached_tokens == 0
    second = first + [{"role": "assistant", "content": reply},
                      {"role": "user", "content": "What did Max do next in the big park?"}]
    text_warm, u2 = turn(warm.client(), second)
    # all of the first prompt is shared (its last, partial block too); the
    # reply's KV came from decoding, which is never shared
    assert u2.prompt_tokens_details.cached_tokens == u1.prompt_tokens
    assert u2.prompt_tokens_details.cached_tokens < u2.prompt_tokens

    cold = augur_server(TINY_GGUF, "--parallel", "2")
    text_cold, u3 = turn(cold.client(), second)
    assert u3.prompt_tokens_details.cached_tokens == 0
    assert text_warm == text_cold


def test_same_prompt_twice_recomputes_only_the_last_token(tiny_server):
    c = tiny_server.client()
    msgs = [{"role": "user", "content": "The cat sat on the mat and looked at the bird in the tree."}]
    a, ua = turn(c, msgs, n=16)
    b, ub = turn(c, msgs, n=16)
    assert a == b
    assert ub.prompt_tokens_details.cached_tokens == ub.prompt_tokens - 1 > 0
