"""The scheduler and the block pool on token lists alone: no model, no tensors."""

from lmforge.infer.blocks import NULL_BLOCK, BlockPool
from lmforge.infer.scheduler import Scheduler, Sequence


def run(scheduler, step):
    """What the engine does after a forward: count the computed tokens, sample a token (here
    always 7) for each sequence whose tokens are all computed."""
    for chunk in step.chunks:
        scheduler.computed(chunk.seq, chunk.end - chunk.start)
        if chunk.completes:
            chunk.seq.tokens.append(7)
    for seq in step.decodes:
        scheduler.computed(seq, 1)
        seq.tokens.append(7)


def drive(scheduler, seqs, max_len):
    """Step until every sequence has max_len tokens; the steps taken."""
    steps = []
    while scheduler.has_work():
        step = scheduler.schedule()
        run(scheduler, step)
        steps.append(step)
        for seq in list(scheduler.running):
            if len(seq.tokens) >= max_len:
                scheduler.finish(seq)
    assert all(len(s.tokens) == max_len for s in seqs)
    return steps


def test_blocks_are_counted_shared_cached_and_evicted_least_recently_used_first():
    pool = BlockPool(n_blocks=5, block_size=4)
    assert pool.capacity == 4 and pool.n_free == 4
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert NULL_BLOCK not in a + b and pool.allocate(1) is None  # all held
    pool.register(a[0], 100)
    pool.register(b[0], 200)
    pool.release(a)
    pool.release(b)
    assert pool.n_free == 4 and pool.n_held == 0
    assert pool.lookup([100, 999]) == [a[0]]  # a prefix hit, held again
    assert pool.n_held == 1
    pool.release([a[0]])
    pool.lookup([200])  # b[0] used after a[0]: a[0] is now the least recently used
    pool.release([b[0]])
    taken = pool.allocate(3)  # the two uncached blocks, then the oldest cached one
    assert a[0] in taken and b[0] not in taken
    assert pool.lookup([100]) == [] and pool.lookup([200]) == [b[0]]


def test_free_blocks_are_handed_out_lowest_first_whatever_order_they_were_freed_in():
    """Sequences decoded together grow in step: lowest first gives them neighbouring blocks."""
    pool = BlockPool(n_blocks=1 + 8, block_size=4)
    held = [pool.allocate(2) for _ in range(4)]
    assert held == [[1, 2], [3, 4], [5, 6], [7, 8]]
    for blocks in (held[2], held[0], held[3]):
        pool.release(blocks)
    assert [pool.allocate(1)[0] for _ in range(4)] == [1, 2, 5, 6]
    pool.register(held[1][0], 300)
    pool.release(held[1])
    pool.clear_cache()  # new weights: the cached block is free again, in its place
    assert pool.allocate(3) == [3, 4, 7]


def test_admission_asks_for_the_blocks_of_its_tokens_not_of_its_longest_length():
    pool = BlockPool(n_blocks=1 + 8, block_size=16)  # 128 positions
    scheduler = Scheduler(pool, max_seqs=8, max_step_tokens=512)
    seqs = [Sequence([1] * 20 + [i]) for i in range(4)]  # 21 tokens: 2 blocks each
    for seq in seqs:
        scheduler.add(seq)
    step = scheduler.schedule()
    # A slot cache reserving prompt + max_tokens (say 21 + 100) each would admit one.
    assert len(step.chunks) == 4 and pool.n_held == 8


def test_a_shared_prefix_is_computed_once_and_reused_from_the_cache():
    pool = BlockPool(n_blocks=1 + 32, block_size=4)
    scheduler = Scheduler(pool, max_seqs=4, max_step_tokens=512)
    system = list(range(100, 140))  # 40 tokens: 10 full blocks
    first = Sequence([*system, 1, 2, 3])
    scheduler.add(first)
    drive(scheduler, [first], 44)
    second = Sequence([*system, 4, 5])
    scheduler.add(second)
    step = scheduler.schedule()
    assert second.cached_tokens == 40
    assert [(c.start, c.end) for c in step.chunks] == [(40, 42)]  # only its own tokens
    assert pool.hit_tokens == 40


def test_a_conversation_turn_prefills_only_what_the_last_turn_did_not_compute():
    pool = BlockPool(n_blocks=1 + 64, block_size=4)
    scheduler = Scheduler(pool, max_seqs=4, max_step_tokens=512)
    history: list[int] = []
    computed = []
    for turn in range(4):
        history = history + [10 + turn] * 9  # the new user message
        seq = Sequence(list(history))
        scheduler.add(seq)
        while len(seq.tokens) < len(history) + 6:  # a 6-token reply
            step = scheduler.schedule()
            computed.append((turn, sum(c.end - c.start for c in step.chunks)))
            run(scheduler, step)
        scheduler.finish(seq)
        history = seq.tokens
    for turn in (1, 2, 3):
        prefilled = sum(n for t, n in computed if t == turn and n > 1)
        assert 9 <= prefilled < 9 + pool.block_size  # the new message, and the rest of a block


def test_a_long_prompt_is_chunked_while_a_running_request_decodes_every_step():
    pool = BlockPool(n_blocks=1 + 64, block_size=4)
    scheduler = Scheduler(pool, max_seqs=4, max_step_tokens=32)
    short = Sequence([1, 2, 3])
    scheduler.add(short)
    run(scheduler, scheduler.schedule())
    long = Sequence(list(range(100)))
    scheduler.add(long)
    chunks = []
    while long.pending > 0 and len(long.tokens) == 100:
        step = scheduler.schedule()
        assert step.decodes == [short]  # the running request gets its token every step
        chunks += [(c.start, c.end) for c in step.chunks]
        run(scheduler, step)
    assert chunks == [(0, 31), (31, 62), (62, 93), (93, 100)]  # 32 tokens a step, less 1 decode
    assert len(long.tokens) == 101  # sampled once its prompt was all computed


def test_when_the_pool_runs_out_the_newest_is_preempted_and_later_finishes():
    pool = BlockPool(n_blocks=1 + 10, block_size=4)
    scheduler = Scheduler(pool, max_seqs=4, max_step_tokens=64)
    seqs = [Sequence([i] * 6) for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    steps = drive(scheduler, seqs, 6 + 12)  # each ends holding 5 blocks: 20 > 10
    preempted = [s for step in steps for s in step.preempted]
    assert preempted and seqs[0] not in preempted  # the oldest runs through
    assert all(s.preemptions > 0 for s in preempted)
    assert pool.n_held == 0 and not scheduler.running and not scheduler.waiting
    assert max(len(step.decodes) + len(step.chunks) for step in steps) >= 2


def test_an_identical_request_admitted_in_the_same_step_forks_the_first():
    pool = BlockPool(n_blocks=1 + 16, block_size=4)
    scheduler = Scheduler(pool, max_seqs=4, max_step_tokens=512)
    seqs = [Sequence([5] * 10) for _ in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    step = scheduler.schedule()
    first, *forks = step.chunks
    assert first.source is None and all(c.source is first.seq for c in forks)
    for fork in forks:
        assert fork.seq.blocks[:2] == first.seq.blocks[:2]  # the two full blocks, shared
        assert fork.seq.blocks[2] != first.seq.blocks[2]  # the partial one, its own copy
    assert pool.n_held == 3 + 2  # 3 blocks computed once, and two private last blocks
    run(scheduler, step)
    assert all(s.pending == 1 for s in seqs)


def test_requests_arriving_together_with_one_long_prompt_compute_it_once():
    pool = BlockPool(n_blocks=1 + 64, block_size=4)
    scheduler = Scheduler(pool, max_seqs=4, max_step_tokens=16)
    system = list(range(100, 148))  # 48 tokens: 12 blocks, 3 steps of 16
    seqs = [Sequence([*system, i]) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    computed = 0
    while any(len(s.tokens) == 49 for s in seqs):
        step = scheduler.schedule()
        computed += sum(c.end - c.start for c in step.chunks if c.source is None)
        computed += len(step.decodes)
        run(scheduler, step)
    # Without reuse the three would compute 3 x 49 prompt tokens; the later ones join the
    # first one's blocks as it computes them, up to a chunk each and their own last block.
    assert computed < 49 + 2 * (16 + 4) + 3
