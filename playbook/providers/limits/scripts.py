"""The Lua scripts of the shared limiter: each decision is one atomic step inside Redis.

Time is Redis's own (``TIME``), so processes on machines whose clocks disagree still agree on
every slot, hold and expiry; each script returns that ``now`` so the caller can translate to its
loop clock.  Floats leave a script as strings (Redis would truncate a Lua number to an integer).

Keys, all under one hash tag (:func:`key_prefix`: ``playbook:limit:{<account>}:``) so a Redis
Cluster keeps them in one slot, as a script must: the keys a script builds from the prefix it is
passed (``{p}sent:N``) are in that slot too.

    {p}gcra       the GCRA's theoretical arrival time of the next unit (seconds, Redis time)
    {p}hold       when the provider-wide hold ends (absent: none)
    {p}permits    sorted set: permit id -> expiry; a permit not renewed in time is evicted, so
                  the slot of a process killed mid-call comes back
    {p}tokens     the token budgets' GCRAs (``tpm``; ``itpm`` and ``otpm`` at {p}input and
    {p}input      {p}output): each its theoretical arrival time, like gcra
    {p}output
    {p}held       output tokens the calls in flight reserved (their max_tokens, held until answered)
    {p}aimd       hash: rate (absent: unlimited), last_cut, target, level (the base of the last
                  cut), slow, grown, started, resumed
    {p}sent:N     units sent / refused in the 0.1 s bucket N (expire after a few seconds): what
    {p}refused:N  the provider let in lately, account-wide, the base of a rate cut
    {p}refusals:N 429s answered in the 0.1 s bucket N: whether a refusal is a lone one
    {p}winlog     sorted set: permit id -> when it went, under a configured window (its span of them)
    {p}allow      hash: a learnt window allowance: limit, opened (when the window opened), count,
                  learnt (the window it was read in), single_at (the first call past it)
    {p}allowlog   sorted set: permit id -> when it went, in the learnt window (RECENT seconds of them)

The AIMD arithmetic is :class:`~playbook.providers.limits.pace.Pace`'s, with its constants, over the
account's sends instead of one process's.
"""

from __future__ import annotations

from urllib.parse import quote

from playbook.providers.limits.allowance import Allowance
from playbook.providers.limits.budgets import MINUTE
from playbook.providers.limits.pace import Pace

__all__ = [
    "ACQUIRE",
    "CHARGE",
    "HELD",
    "HOLD",
    "REFUSED",
    "RELEASE",
    "RENEW",
    "SETTLE",
    "TOKENS",
    "key_prefix",
    "maybe_float",
    "optional",
]


def key_prefix(account: str) -> str:
    """Where an account's state lives: ``playbook:limit:{<account>}:``, the account its keys' hash
    tag, so a cluster keeps them all in one slot.  Redis hashes what is between the first ``{``
    and the first ``}`` after it, so braces inside the account still tag every key alike (with
    part of it); only an account that would leave the tag empty (one starting with ``}``, or
    none) has no tag, its keys spread over slots.  Such an account is written percent-encoded,
    after a ``%`` no other account's prefix has there: every other account keeps the keys it
    always had, which processes of an older playbook use too."""
    if account.startswith("}") or not account:
        return f"playbook:limit:%{{{quote(account, safe='') or '%'}}}:"
    return f"playbook:limit:{{{account}}}:"


def optional(value: float | None) -> str:
    """A number a script takes, or ``''`` for none (the scripts' ``num()`` reads it as nil)."""
    return "" if value is None else f"{value:.6f}"


def maybe_float(raw: bytes | None) -> float | None:
    """A number a script answered, or None for its empty answer."""
    return float(raw) if raw else None


_PRELUDE = f"""
local WINDOW, LEAST, CUT, DEEP, SOON = {Pace.WINDOW}, {Pace.LEAST}, {Pace.CUT}, {Pace.DEEP}, {Pace.SOON}
local KNOWN, RECOVER, PROBE, FORGET, GROW = {Pace.KNOWN}, {Pace.RECOVER}, {Pace.PROBE}, {Pace.FORGET}, {Pace.GROW}
local CALM, JITTER, FEW, RECENT, SURE = {Pace.CALM}, {Pace.JITTER}, {Pace.FEW}, {Allowance.RECENT}, {Allowance.SURE}
local SPAN, COARSE = {Pace.SPAN}, {Pace.COARSE}
local STATE_TTL = 3600
local MINUTE = {MINUTE}
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function fmt(x)
  if x == nil then return '' end
  return string.format('%.6f', x)
end
local function num(v)
  if v == false or v == nil or v == '' then return nil end
  return tonumber(v)
end
local function field(key, name) return num(redis.call('HGET', key, name)) end
-- the shared rate: absent is unlimited, unless this process configured a ceiling
local function current_rate(aimd, ceiling)
  local rate = field(aimd, 'rate')
  if rate == nil and ceiling ~= nil then
    rate = ceiling
    redis.call('HSET', aimd, 'rate', fmt(rate))
  end
  if rate ~= nil and ceiling ~= nil and rate > ceiling then rate = ceiling end
  return rate
end
local function meter(prefix, kind, at, units)
  local key = prefix .. kind .. ':' .. math.floor(at * 10)
  redis.call('INCRBYFLOAT', key, units)
  redis.call('EXPIRE', key, math.ceil(SPAN) + 2)
end
local function metered(prefix, kind, start, now)
  local first, last, total = math.floor(start * 10), math.floor(now * 10), 0
  for b = first, last do
    local v = tonumber(redis.call('GET', prefix .. kind .. ':' .. b) or '0')
    if b == first then v = v * math.min(1, math.max(0, (first + 1) / 10 - start) * 10) end
    total = total + v
  end
  return total
end
-- units a second the provider let in lately (sent less refused), over the time since sending
-- (re)started within WINDOW: a hold's silence is ours, not the provider's verdict
local function span_start(aimd, now)
  local start = now - WINDOW
  local started, resumed = field(aimd, 'started'), field(aimd, 'resumed')
  if started ~= nil and started > start then start = started end
  if resumed ~= nil and resumed <= now and resumed > start then start = resumed end
  return start
end
local function through(prefix, aimd, now)
  local start = span_start(aimd, now)
  return math.max(0, metered(prefix, 'sent', start, now) - metered(prefix, 'refused', start, now)), now - start
end
-- A learnt allowance (Allowance): the calls of the window that opened when sending last resumed
-- (a hold's end), sent before sent_at.
local function allowed_before(allow, log, sent_at)
  local count = field(allow, 'count') or 0
  return count - redis.call('ZCOUNT', log, fmt(sent_at), '+inf')
end
local function accepted(prefix, aimd, now)
  if field(aimd, 'started') == nil then return nil end
  local n, span = through(prefix, aimd, now)
  if span < LEAST or n <= 0 then return nil end
  return n / span
end
"""

# KEYS: gcra, hold, permits, aimd, allow, allowlog, winlog.  ARGV: prefix, id, weight, limit (0: none),
# ttl, ceiling ('' none), burst, horizon, window calls (0: the allowance is learnt), window span.
# -> {status, now, hold, rate, level, wait}; status: held | full | wait | go.
_ACQUIRE = """
local prefix, id, weight, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, ceiling, burst, horizon = tonumber(ARGV[5]), num(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local wcalls, wspan = tonumber(ARGV[9]), tonumber(ARGV[10])
local aimd, allow, allowlog, winlog = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local now = clock()
local hold = tonumber(redis.call('GET', KEYS[2]) or '0')
local rate = current_rate(aimd, ceiling)
if hold > now then
  redis.call('ZREM', KEYS[3], id)
  return {'held', fmt(now), fmt(hold), fmt(rate), '0', '0'}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', fmt(now))
-- a learnt allowance: a window opens when sending resumes after a hold; used up, one call at a time
local resumed = field(aimd, 'resumed') or now
if wcalls == 0 and resumed <= now and (field(allow, 'opened') or -math.huge) < resumed then
  redis.call('HSET', allow, 'opened', fmt(resumed), 'count', '0')
  redis.call('HDEL', allow, 'single_at')
  redis.call('DEL', allowlog)
end
local allowed = field(allow, 'limit')
local single = wcalls == 0 and allowed ~= nil and (field(allow, 'count') or 0) >= math.ceil(allowed * SURE)
if not redis.call('ZSCORE', KEYS[3], id) then
  local n = redis.call('ZCARD', KEYS[3])
  if (limit > 0 and n >= limit) or (single and n > 0) then
    return {'full', fmt(now), fmt(hold), fmt(rate), tostring(n), '0'}
  end
  redis.call('ZADD', KEYS[3], fmt(now + ttl), id)
end
local level = redis.call('ZCARD', KEYS[3])
local go = now
if wcalls > 0 then  -- a configured window: no span of wspan holds more than wcalls calls
  redis.call('ZREMRANGEBYSCORE', winlog, '-inf', fmt(now - wspan))
  local n = redis.call('ZCARD', winlog)
  if n >= wcalls then
    local oldest = redis.call('ZRANGE', winlog, n - wcalls, n - wcalls, 'WITHSCORES')
    go = math.max(go, tonumber(oldest[2]) + wspan)
  end
end
local tat = nil
if rate ~= nil then
  tat = tonumber(redis.call('GET', KEYS[1]) or '0')
  go = math.max(go, tat - math.max(0, burst - weight) / rate)
end
if go - now > horizon then
  return {'wait', fmt(now), fmt(hold), fmt(rate), tostring(level), fmt(go - now)}
end
if rate ~= nil then
  local new = math.max(tat, go) + weight / rate
  redis.call('SET', KEYS[1], fmt(new), 'PX', math.ceil((new - now) * 1000) + 60000)
end
if wcalls > 0 then
  redis.call('ZADD', winlog, fmt(go), id)
  redis.call('PEXPIRE', winlog, math.ceil(wspan * 1000) + 60000)
else
  if single then redis.call('HSETNX', allow, 'single_at', fmt(go)) end
  redis.call('HINCRBY', allow, 'count', 1)
  redis.call('ZADD', allowlog, fmt(go), id)
  redis.call('ZREMRANGEBYSCORE', allowlog, '-inf', fmt(now - RECENT))
  redis.call('EXPIRE', allow, STATE_TTL)
  redis.call('EXPIRE', allowlog, STATE_TTL)
end
meter(ARGV[1], 'sent', go, weight)
if redis.call('HSETNX', aimd, 'started', fmt(now)) == 1 then
  redis.call('HSETNX', aimd, 'resumed', fmt(now))
end
redis.call('EXPIRE', aimd, STATE_TTL)
return {'go', fmt(now), fmt(hold), fmt(rate), tostring(level), fmt(go - now)}
"""

# KEYS: gcra, permits, aimd, allow, allowlog.  ARGV: prefix, id, extra units, ceiling, sent_at
# (Redis time).  -> {now, rate}
_SETTLE = """
local prefix, id, extra, ceiling, sent_at = ARGV[1], ARGV[2], tonumber(ARGV[3]), num(ARGV[4]), tonumber(ARGV[5])
local aimd, allow = KEYS[3], KEYS[4]
local now = clock()
redis.call('ZREM', KEYS[2], id)
-- a call let in past a learnt allowance (one at a time): it was read too low, and doubles
local allowed = field(allow, 'limit')
if allowed ~= nil and sent_at >= (field(allow, 'single_at') or math.huge) and sent_at >= (field(allow, 'opened') or math.huge) then
  local place = allowed_before(allow, KEYS[5], sent_at) + 1
  if place > allowed then redis.call('HSET', allow, 'limit', tostring(2 * place)) end
end
local rate = current_rate(aimd, ceiling)
if rate == nil then return {fmt(now), ''} end
if extra ~= 0 then
  local tat = num(redis.call('GET', KEYS[1]))
  if tat ~= nil then redis.call('SET', KEYS[1], fmt(tat + extra / rate), 'KEEPTTL') end
  meter(prefix, 'sent', now, extra)
end
local last_cut = field(aimd, 'last_cut') or -math.huge
local target = nil
if now - last_cut < FORGET then target = field(aimd, 'target') end
local new
if redis.call('HGET', aimd, 'slow') == '1' then
  -- by the clock rather than per success: slow answers come seldom
  local since = math.max(field(aimd, 'grown') or -math.huge, field(aimd, 'resumed') or -math.huge)
  new = rate
  if now > since then new = rate * math.exp(GROW * math.min(1, now - since)) end
  redis.call('HSET', aimd, 'grown', fmt(now))
  local sending = accepted(prefix, aimd, now)
  if sending ~= nil then new = math.max(rate, math.min(new, 2 * sending)) end
elseif target ~= nil and rate < target then
  new = math.min(target, rate + RECOVER * target / rate)
elseif target == nil and ceiling ~= nil then
  new = rate + RECOVER * ceiling / rate
else
  new = rate + PROBE
end
if ceiling ~= nil then new = math.min(ceiling, new) end
redis.call('HSET', aimd, 'rate', fmt(new))
redis.call('EXPIRE', aimd, STATE_TTL)
return {fmt(now), fmt(new)}
"""

# KEYS: permits, aimd, allow, allowlog.  ARGV: prefix, id, sent_at (Redis time), judge (1: the
# rate's verdict), ceiling, floor, hint (none | short | coarse: short, in whole seconds | long),
# learn (1: the allowance is learnt).
# -> {now, rate, verdict}: lone | cut | noted
_REFUSED = """
local prefix, id, sent_at, judge = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local ceiling, floor, hint, learn = num(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8]
local short = hint == 'short' or hint == 'coarse'
local aimd, allow = KEYS[2], KEYS[3]
local now = clock()
redis.call('ZREM', KEYS[1], id)
meter(prefix, 'refused', sent_at, 1)
meter(prefix, 'refusals', now, 1)
local rate = current_rate(aimd, ceiling)
local slow = redis.call('HGET', aimd, 'slow') == '1'
local last_cut = field(aimd, 'last_cut') or -math.huge
-- A lone refusal (Pace.lone): the rate under any level refused (configured, or the base of the
-- last cut), the hint short, and refusals few among the calls the account sent lately.  It
-- changes nothing; the refused call waits its hint alone.
local level = nil
if now - last_cut < FORGET then level = field(aimd, 'level') end
local under = rate ~= nil and ((level ~= nil and rate < level) or (level == nil and ceiling ~= nil and rate <= ceiling))
-- A learnt window's end (Allowance.ends): a call past this window's allowance, whatever its hint
local opened, allowed = field(allow, 'opened'), field(allow, 'limit')
local ends = hint ~= 'none' and learn == '1' and allowed ~= nil and opened ~= nil and sent_at >= opened
  and (field(allow, 'learnt') or math.huge) < opened and allowed_before(allow, KEYS[4], sent_at) >= math.ceil(allowed * SURE)
local function few(span)
  return metered(prefix, 'refusals', now - span, now) <= math.max(FEW, JITTER * metered(prefix, 'sent', now - span, now))
end
-- a coarse hint (whole seconds, COARSE intervals or more): judged over SPAN too (Pace.lone)
if short and under and not slow and not ends then
  if few(CALM) or (hint == 'coarse' and rate >= COARSE and few(SPAN)) then
    -- refused here once, if only by jitter: a probe that reaches this rate again measures
    if level ~= nil then redis.call('HSET', aimd, 'level', fmt(math.min(level, rate))) end
    return {fmt(now), fmt(rate), 'lone'}
  end
end
-- A long hint: a window's end, most likely: what it let in is the allowance
if (hint == 'long' or ends) and learn == '1' and opened ~= nil and sent_at >= opened then
  local before = allowed_before(allow, KEYS[4], sent_at)
  if before > 0 and field(allow, 'learnt') == opened and allowed ~= nil then  -- the fewest of the window's refused calls
    redis.call('HSET', allow, 'limit', tostring(math.min(allowed, before)))
  elseif before > 0 then
    redis.call('HSET', allow, 'limit', tostring(before), 'learnt', fmt(opened))
  end
end
if ends then return {fmt(now), fmt(rate), 'noted'} end  -- its hint holds; no word on the rate
-- Cut once per episode: a call sent before the last cut, or before sending resumed after a hold
-- (another process's call already on its way), says nothing new.
local resumed = field(aimd, 'resumed') or now
if judge ~= '1' or sent_at <= last_cut or sent_at < resumed then return {fmt(now), fmt(rate), 'noted'} end
local acc = accepted(prefix, aimd, now)
local target = field(aimd, 'target')
local base, cut
if rate == nil then
  local n = through(prefix, aimd, now)
  if n <= 0 then return {fmt(now), '', 'noted'} end  -- nothing got through lately: a quota, not a rate
  if acc ~= nil then base, cut, slow = acc, CUT, false else base, cut, slow = n, 1.0, true end
  redis.call('HSET', aimd, 'grown', fmt(math.max(now, resumed)))
  target = nil
elseif slow then
  if acc == nil then return {fmt(now), fmt(rate), 'noted'} end  -- too early to measure: nothing new
  base, cut, slow, target = acc, CUT, false, nil
else
  base = rate
  -- refused soon after sending (re)started: what was let in measures how it started (Pace.limited)
  local soon = now - resumed < SOON
  if acc ~= nil and acc < rate and not soon then base = acc end
  if soon then cut = DEEP else cut = CUT end
end
-- refused again at (or under) the level recovered to: that level was too high too
local again = target ~= nil and now - last_cut < FORGET and (rate or 0) <= target * 1.01
local new = math.max(floor, base * cut)
redis.call('HSET', aimd, 'rate', fmt(new), 'last_cut', fmt(now), 'slow', slow and '1' or '0')
if slow then
  redis.call('HDEL', aimd, 'target')
elseif again then
  redis.call('HSET', aimd, 'target', fmt(new), 'level', fmt(base))
else
  redis.call('HSET', aimd, 'target', fmt(math.max(new, base * KNOWN)), 'level', fmt(base))
end
redis.call('EXPIRE', aimd, STATE_TTL)
return {fmt(now), fmt(new), 'cut'}
"""

# KEYS: hold.  ARGV: prefix.  -> {now, hold}
_HELD = """
return {fmt(clock()), fmt(tonumber(redis.call('GET', KEYS[1]) or '0'))}
"""

# KEYS: permits.  ARGV: prefix, id.  -> now
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[2])
return fmt(clock())
"""

# KEYS: hold, aimd.  ARGV: prefix, seconds.  -> {now, the hold's end in force}
_HOLD = """
local now = clock()
local seconds = tonumber(ARGV[2])
local ends = now + seconds
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current >= ends then return {fmt(now), fmt(current)} end
redis.call('SET', KEYS[1], fmt(ends), 'PX', math.ceil(seconds * 1000) + 1000)
local resumed = field(KEYS[2], 'resumed')
if resumed == nil or resumed < ends then redis.call('HSET', KEYS[2], 'resumed', fmt(ends)) end
return {fmt(now), fmt(ends)}
"""

# KEYS: permits.  ARGV: prefix, ttl, ids...  -> now.  XX: a permit evicted already stays evicted.
_RENEW = """
local now = clock()
local expires = fmt(now + tonumber(ARGV[2]))
for i = 3, #ARGV do redis.call('ZADD', KEYS[1], 'XX', expires, ARGV[i]) end
return fmt(now)
"""

# Each script carries the prelude: EVALSHA runs one self-contained source.
# KEYS: the token budgets the call is charged to (tokens, input, output: those the account has),
# then held.  ARGV: prefix, the output this call reserves (held while it is in flight), then for
# each budget: weight, rate (tokens a second), burst, whether reservations in flight give it room
# ('1': tokens and output).  -> {now, wait}: the call's tokens are reserved in every budget, to be
# sent ``wait`` seconds from now, when the slowest has room (Budgets: each paced evenly, never a
# minute at once; what calls in flight reserved does not keep the next waiting, up to a minute's worth).
_TOKENS = """
local n = #KEYS - 1
local reserve = tonumber(ARGV[2])
local held = math.max(0, tonumber(redis.call('GET', KEYS[#KEYS]) or '0')) + reserve
local now = clock()
local go, tats = now, {}
for i = 1, n do
  local a = 4 * i - 1
  local weight, rate, burst = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local room = 0
  if ARGV[a + 3] == '1' and held > 0 then room = math.min(held, math.max(0, MINUTE * rate - burst)) end
  tats[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  go = math.max(go, tats[i] - math.max(0, burst + room - weight) / rate)
end
-- a schedule that refunds took into the past restarts with the reservations in flight still in it
for i = 1, n do
  local a = 4 * i - 1
  local rate, start = tonumber(ARGV[a + 1]), go
  if ARGV[a + 3] == '1' then start = go + (held - reserve) / rate end
  local new = math.max(tats[i], start) + tonumber(ARGV[a]) / rate
  redis.call('SET', KEYS[i], fmt(new), 'PX', math.ceil((new - now) * 1000) + 60000)
end
if reserve > 0 then
  redis.call('INCRBYFLOAT', KEYS[#KEYS], reserve)
  redis.call('EXPIRE', KEYS[#KEYS], STATE_TTL)
end
return {fmt(now), fmt(go - now)}
"""

# KEYS: token budgets, then held.  ARGV: prefix, the output reservation that ends, then for each
# budget: extra tokens, rate.  A call used more (or fewer) tokens than it reserved: each budget's
# next reservations move by that much; what it reserved is no longer held.
_CHARGE = """
local n = #KEYS - 1
for i = 1, n do
  local tat = num(redis.call('GET', KEYS[i]))
  if tat ~= nil then
    redis.call('SET', KEYS[i], fmt(tat + tonumber(ARGV[2 * i + 1]) / tonumber(ARGV[2 * i + 2])), 'KEEPTTL')
  end
end
local unreserve = tonumber(ARGV[2])
if unreserve > 0 then
  local held = tonumber(redis.call('GET', KEYS[#KEYS]) or '0') - unreserve
  if held > 0 then redis.call('SET', KEYS[#KEYS], fmt(held), 'KEEPTTL') else redis.call('DEL', KEYS[#KEYS]) end
end
return 1
"""

ACQUIRE = _PRELUDE + _ACQUIRE
TOKENS = _PRELUDE + _TOKENS
CHARGE = _PRELUDE + _CHARGE
SETTLE = _PRELUDE + _SETTLE
REFUSED = _PRELUDE + _REFUSED
HELD = _PRELUDE + _HELD
RELEASE = _PRELUDE + _RELEASE
HOLD = _PRELUDE + _HOLD
RENEW = _PRELUDE + _RENEW
