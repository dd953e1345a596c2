"""The Wireshark dissector ``aiogc.lua``, generated from the codec's field table.

:func:`render` fills the kinds, their fields in wire order and their msgpack forms
(:data:`aiogc.protocol.headers.WIRE_FIELDS`) into the Lua template below, so the dissector
and the codec cannot drift (``tests/test_pcap.py`` checks the shipped file against it). The
file ships inside the package, beside this module (:data:`LUA_PATH`)::

    python -m aiogc.protocol.dissector --path      # where the installed dissector is
    tshark -X lua_script:"$(python -m aiogc.protocol.dissector --path)" -r capture.pcap
    python -m aiogc.protocol.dissector --write     # regenerate it after a wire change
    python -m aiogc.protocol.dissector FILE        # or write it elsewhere (no argument: stdout)
"""

from __future__ import annotations

import sys
from pathlib import Path

from aiogc.protocol.headers import DEFAULT_LIMITS, DTYPE_CODES, KIND_CODES, WIRE_FIELDS
from aiogc.protocol.messages import PROTOCOL_VERSION

__all__ = ["LUA_PATH", "main", "render"]

#: the generated dissector, shipped as package data
LUA_PATH = Path(__file__).with_name("aiogc.lua")

#: how the dissector declares a field of each msgpack form (``%s``: the field's name)
_PROTO_FIELD = {
    "uint": 'ProtoField.uint64("aiogc.%s", "%s")',
    "dtype": 'ProtoField.uint64("aiogc.%s", "%s (payload dtype code)")',
    "float": 'ProtoField.double("aiogc.%s", "%s")',
    "str": 'ProtoField.string("aiogc.%s", "%s")',
    "bin": 'ProtoField.bytes("aiogc.%s", "%s")',
    "uint_array": 'ProtoField.string("aiogc.%s", "%s")',
    "float_array": 'ProtoField.string("aiogc.%s", "%s")',
    "map": 'ProtoField.string("aiogc.%s", "%s")',
    "payload": 'ProtoField.bytes("aiogc.%s", "%s (payload)")',
}


def render() -> str:
    """The text of the dissector (``aiogc.lua``) for this version of the protocol."""
    kinds = sorted(KIND_CODES.items(), key=lambda kv: kv[1])
    kind_rows = [f'  [{code}] = "{kind}",' for kind, code in kinds]
    field_rows = []
    forms: dict[str, str] = {}
    for kind, code in kinds:
        entries = []
        for name, checker in WIRE_FIELDS[kind]:
            entries.append(f'{{"{name}", "{checker.tag}"}}')
            forms.setdefault(name, checker.tag)
        field_rows.append(f"  [{code}] = {{ {', '.join(entries)} }},  -- {kind}")
    defs = [f"  {name} = {_PROTO_FIELD[form] % (name, name)},"
            for name, form in sorted(forms.items())]
    dtypes = [f'  [{code}] = {{ {dt.itemsize}, "{"bfloat16 <u2" if code == 0x82 else dt.str}" }},'
              for code, dt in sorted(DTYPE_CODES.items())]
    return (_TEMPLATE.lstrip("\n").replace("@VERSION@", str(PROTOCOL_VERSION))
            .replace("@MAX_BODY@", str(DEFAULT_LIMITS.max_body_bytes))
            .replace("@KINDS@", "\n".join(kind_rows))
            .replace("@FIELDS@", "\n".join(field_rows))
            .replace("@DTYPES@", "\n".join(dtypes))
            .replace("@FIELDDEFS@", "\n".join(defs)))


def main(argv: list[str] | None = None) -> int:
    """``--path``: print :data:`LUA_PATH`; ``--write``: regenerate it; ``FILE``: write the
    dissector there; nothing: write it to stdout."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--path"]:
        sys.stdout.write(f"{LUA_PATH}\n")
        return 0
    if len(args) > 1 or (args and args[0].startswith("-") and args[0] != "--write"):
        sys.stderr.write("usage: python -m aiogc.protocol.dissector [--path | --write | FILE]\n")
        return 2
    text = render()
    if args:
        target = LUA_PATH if args[0] == "--write" else Path(args[0])
        target.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


_TEMPLATE = r"""
-- Wireshark dissector for the aiogc wire protocol, version @VERSION@ (docs/protocol.md §2-§3).
--
--   tshark -X lua_script:aiogc.lua -r capture.pcap
--   wireshark -X lua_script:aiogc.lua capture.pcap
--   (this file ships inside the aiogc package: `python -m aiogc.protocol.dissector --path`
--   prints where; or copy it into Wireshark's personal plugins folder)
--
-- Captures come from `aiogc run --pcap FILE` (aiogc/net/pcap.py: synthetic TCP/IPv4 flows of
-- the PS's connections) or from any real capture of aiogc traffic. The dissector finds aiogc
-- streams heuristically (a frame prefix whose body starts [PROTOCOL_VERSION, kind code, as a
-- msgpack array) and stays on the stream; "Decode As... > TCP port > AIOGC" forces it.
-- The PS listens on an ephemeral port, which may be one another dissector registered: add
-- `-o tcp.try_heuristic_first:TRUE` (tshark) or tick "Try heuristic sub-dissectors first"
-- in the TCP protocol preferences (Wireshark) so that the heuristic runs first.
--
-- What it shows: every frame's length prefix, version, kind (name and code), every field of
-- every kind by name (each body is one msgpack array, [version, kind, fields...], in the
-- order of the FIELDS table below; welcome's config map nested), an array kind's payload
-- (dtype, length, first values, little-endian) and the 16-byte frame tag. Tags are SHOWN,
-- NOT VERIFIED (verifying needs the session key).
-- Whether a frame carries a tag follows §2.1: never on challenge / hello / welcome; after the
-- handshake only if the connection has a secret (hello's mac is non-empty); in the W->PS
-- direction from the frame after hello, in the PS->W direction from the frame after welcome.
-- A stream picked up mid-way (no handshake seen) guesses per frame: tagged if a frame
-- (or the end of the data) follows 16 bytes after the frame.
--
-- Worker hosts (§2.6: `aiogc worker --id A-B`, `aiogc run --worker-hosts N`): a host connection
-- is recognised by its 12-byte "AGCH" preamble (the host's, role 0, first on the stream; the
-- PS's, role 1, after the plain `challenge` the PS sent at accept, before it knew it was a
-- host; a refusal is a plain `error` instead). After a direction's preamble, its PDUs are
-- records: a 2-byte slot and one frame of worker `first + slot` (shown as aiogc.slot and
-- aiogc.worker_id), a 6-byte control record (OPEN / CLOSE, aiogc.ctrl_op), or slot 0xFFFE and
-- a plain `error` about the host connection itself. Tags follow each worker session's own
-- handshake (per slot; an OPEN starts a new session).
--
-- Layering, so that a framing-level change stays local:
--   stream layer  aiogc.dissector / next_pdu: TCP reassembly, one PDU after the other; every
--                 PDU's type and length are remembered on the first pass, so a revisit (a
--                 click in Wireshark) dissects as the first pass did
--   framing layer next_pdu / dissect_preamble / dissect_control / dissect_record_prefix:
--                 plain frames, or a host connection's preamble and records
--   frame layer   dissect_frame: prefix, the msgpack array by kind, tag
--   kind layer    FIELDS (every kind's fields in wire order) and dissect_fields
--
-- GENERATED by `python -m aiogc.protocol.dissector` from aiogc.protocol.headers.WIRE_FIELDS
-- (tests/test_pcap.py checks that this file is what it writes): edit the generator, not this.

local PROTOCOL_VERSION = @VERSION@
local TAG_BYTES = 16
local MAX_BODY_BYTES = @MAX_BODY@  -- DEFAULT_LIMITS.max_body_bytes (headers.py)
-- worker hosts (hostmux.py)
local HOST_MAGIC = 0x41474348     -- "AGCH"
local PREAMBLE_BYTES = 12         -- magic u32 | version u8 | role u8 | first u32 | count u16
local SLOT_BYTES = 2
local CTRL_BYTES = 6              -- 0xFFFF | op u16 | slot u16
local CTRL_SLOT, HOST_SLOT = 0xFFFF, 0xFFFE
local OPEN, CLOSE = 1, 2

local KINDS = {
@KINDS@
}
local K_CHALLENGE, K_HELLO, K_WELCOME = 1, 2, 3

-- Every kind's fields after [version, kind], in wire order, with their msgpack form: uint,
-- float (float64), str, bin, uint_array / float_array (a msgpack array of them), map
-- (welcome's config), dtype (the payload's dtype code), payload (a bin of little-endian
-- values, the last field of an array kind).
local FIELDS = {
@FIELDS@
}
-- the dtype codes: itemsize and name
local DTYPES = {
@DTYPES@
}

local aiogc = Proto("aiogc", "aiogc gradient coding protocol")
local kind_names = {}
for code, name in pairs(KINDS) do kind_names[code] = name end

local F = {
  body_len = ProtoField.uint32("aiogc.body_len", "Body length"),
  version = ProtoField.uint8("aiogc.version", "Version"),
  kind = ProtoField.uint8("aiogc.kind", "Kind", base.DEC, kind_names),
  kind_name = ProtoField.string("aiogc.kind_name", "Kind name"),
@FIELDDEFS@
  entry_uint = ProtoField.uint64("aiogc.entry_uint", "entry"),
  entry_float = ProtoField.double("aiogc.entry_float", "entry"),
  text = ProtoField.string("aiogc.text", "text field"),
  field = ProtoField.string("aiogc.field", "field"),
  tag = ProtoField.bytes("aiogc.tag", "frame tag (GMAC, not verified)"),
  -- worker hosts
  magic = ProtoField.string("aiogc.magic", "Host preamble magic"),
  role = ProtoField.uint8("aiogc.role", "Role", base.DEC, { [0] = "host", [1] = "PS" }),
  first = ProtoField.uint32("aiogc.first", "First worker id"),
  slots = ProtoField.uint16("aiogc.slots", "Workers in the block (count)"),
  slot = ProtoField.uint16("aiogc.slot", "Slot", base.DEC,
                           { [CTRL_SLOT] = "control", [HOST_SLOT] = "host connection" }),
  worker_id = ProtoField.uint32("aiogc.worker_id", "Worker id (first + slot)"),
  ctrl_op = ProtoField.uint16("aiogc.ctrl_op", "Control operation", base.DEC,
                              { [OPEN] = "OPEN", [CLOSE] = "CLOSE" }),
}
local field_list = {}
for _, f in pairs(F) do field_list[#field_list + 1] = f end
aiogc.fields = field_list

local e_malformed = ProtoExpert.new("aiogc.malformed", "malformed aiogc frame",
                                    expert.group.MALFORMED, expert.severity.ERROR)
aiogc.experts = { e_malformed }

aiogc.prefs.heuristic = Pref.bool("Find aiogc streams heuristically", true,
                                  "look for aiogc frames on any TCP stream")
aiogc.prefs.tags = Pref.enum("Frame tags", 0, "whether frames carry a 16-byte tag", {
  { 1, "auto (follow the handshake)", 0 }, { 2, "always after the handshake", 1 },
  { 3, "never", 2 },
}, false)

-- ---------------------------------------------------------------------------- stream state

-- per TCP stream:
--   ps_port          the PS's port (the sender of challenge, or from a host preamble's role)
--   secret, w_tagged, ps_tagged   a plain connection's tagging state (§2.1): hello's mac is
--                    non-empty; the direction's frames after the handshake carry tags
--   host             { first, count } once a host preamble was seen (§2.6)
--   rec[dir]         that direction's PDUs are records (its preamble was seen)
--   slots[s]         slot s's worker session: secret, w_tagged, ps_tagged as a plain
--                    connection's (reset by OPEN: a new session)
--   pdus[key]        { type, len, slot } of every PDU dissected on the first pass
-- (keyed by the two endpoints, not tcp.stream: a field is not extracted on a first pass
-- without a tree, Wireshark's and `tshark -2`'s)
local streams = {}

local function stream_state(pinfo)
  local a = tostring(pinfo.src) .. ":" .. tostring(pinfo.src_port)
  local b = tostring(pinfo.dst) .. ":" .. tostring(pinfo.dst_port)
  local key = a < b and a .. "-" .. b or b .. "-" .. a
  local st = streams[key]
  if st == nil then st = { rec = {}, slots = {}, pdus = {} }; streams[key] = st end
  return st
end

function aiogc.init()
  streams = {}
end

local function from_ps(st, pinfo)
  if st.ps_port == nil then return nil end
  return pinfo.src_port == st.ps_port
end

local function dir_key(pinfo)
  return tostring(pinfo.src) .. ":" .. tostring(pinfo.src_port)
end

-- ---------------------------------------------------------------------------- frame layer

local function looks_like_frame(tvb, off)
  if tvb:len() < off + 7 then return false end
  local h = tvb(off, 4):uint()
  local arr = tvb(off + 4, 1):uint()
  local ver = tvb(off + 5, 1):uint()
  local kind = tvb(off + 6, 1):uint()
  return h >= 3 and h <= MAX_BODY_BYTES and arr >= 0x90 and arr <= 0x9f
         and ver == PROTOCOL_VERSION and KINDS[kind] ~= nil
end

local function looks_like_preamble(tvb, off)
  return tvb:len() >= off + 6 and tvb(off, 4):uint() == HOST_MAGIC
         and tvb(off + 4, 1):uint() == PROTOCOL_VERSION and tvb(off + 5, 1):uint() <= 1
end

-- A record of a host connection at `off`: a control record, or a slot and a frame.
local function looks_like_record(tvb, off)
  if tvb:len() < off + SLOT_BYTES then return false end
  if tvb(off, 2):uint() == CTRL_SLOT then
    if tvb:len() < off + CTRL_BYTES then return false end
    local op = tvb(off + 2, 2):uint()
    return op == OPEN or op == CLOSE
  end
  return looks_like_frame(tvb, off + SLOT_BYTES)
end

-- The tagging state of the session a frame belongs to: the stream's (plain connection) or
-- its slot's (host connection); nil for the host connection's own frames (never tagged).
local function session(st, slot)
  if slot == nil then return st end
  if slot == HOST_SLOT then return nil end
  local ss = st.slots[slot]
  if ss == nil then ss = {}; st.slots[slot] = ss end
  return ss
end

-- Whether the frame of kind `kind` at [off, off + base) carries a tag: the session's state
-- when its handshake was seen, else a guess from what follows (a frame, or on a host
-- connection a record).
local function has_tag(tvb, off, base_len, kind, st, pinfo, slot)
  if kind == K_CHALLENGE or kind == K_HELLO or kind == K_WELCOME then return false end
  local ss = session(st, slot)
  if ss == nil then return false end
  local mode = aiogc.prefs.tags
  if mode == 2 then return false end
  if mode == 1 then return true end
  local ps = from_ps(st, pinfo)
  if ps ~= nil and ss.secret ~= nil then
    if ps then return ss.ps_tagged == true else return ss.w_tagged == true end
  end
  local looks = slot == nil and looks_like_frame or looks_like_record
  local after = off + base_len
  if tvb:len() == after + TAG_BYTES then return true end
  if tvb:len() == after then return false end
  if looks(tvb, after) then return false end
  return looks(tvb, after + TAG_BYTES)
end

-- Bytes of the frame at `off` (frame + tag), or nil if more data is needed to say.
local function frame_length(tvb, off, st, pinfo, slot)
  local avail = tvb:len() - off
  if avail < 7 then return nil end
  local h = tvb(off, 4):uint()
  if avail < 4 + h then return nil end  -- one more segment (an estimate would be revised:
                                         -- a second pass then misses the PDU)
  local kind = tvb(off + 6, 1):uint()
  local base_len = 4 + h
  if has_tag(tvb, off, base_len, kind, st, pinfo, slot) then return base_len + TAG_BYTES end
  return base_len
end

-- ---------------------------------------------------------------------------- framing layer

-- The PDU at `off`: its type ("frame": a plain connection's frame, or a host connection's
-- frames before its preamble; "preamble"; "control"; "record": a slot and a frame), its
-- length (nil: more data is needed to say; beyond the data: at least that much is needed)
-- and for a record its slot.
local function next_pdu(tvb, off, st, pinfo)
  if tvb:len() - off < 6 then return nil end
  if st.rec[dir_key(pinfo)] then
    local slot = tvb(off, 2):uint()
    if slot == CTRL_SLOT then return "control", CTRL_BYTES end
    local n = frame_length(tvb, off + SLOT_BYTES, st, pinfo, slot)
    if n == nil then return nil end
    return "record", SLOT_BYTES + n, slot
  end
  if tvb(off, 4):uint() == HOST_MAGIC then return "preamble", PREAMBLE_BYTES end
  return "frame", frame_length(tvb, off, st, pinfo, nil)
end

local function dissect_preamble(tvb, off, tree, st, pinfo)
  local version = tvb(off + 4, 1):uint()
  local role = tvb(off + 5, 1):uint()
  local first = tvb(off + 6, 4):uint()
  local count = tvb(off + 10, 2):uint()
  local pt = tree:add(aiogc, tvb(off, PREAMBLE_BYTES))
  pt:add(F.magic, tvb(off, 4))
  pt:add(F.version, tvb(off + 4, 1))
  pt:add(F.role, tvb(off + 5, 1))
  pt:add(F.first, tvb(off + 6, 4))
  pt:add(F.slots, tvb(off + 10, 2))
  local who = role == 0 and "host" or role == 1 and "PS" or ("role " .. role)
  local info = string.format("host preamble(%s, workers %d..%d)", who, first, first + count - 1)
  pt:set_text("aiogc " .. info)
  if version ~= PROTOCOL_VERSION or role > 1 or count == 0 then
    pt:add_proto_expert_info(e_malformed, "bad host preamble (version, role or count)")
  end
  if not pinfo.visited then
    st.host = { first = first, count = count }
    st.rec[dir_key(pinfo)] = true
    if role == 0 then st.ps_port = pinfo.dst_port elseif role == 1 then
      st.ps_port = pinfo.src_port end
  end
  return info
end

local function worker_of(st, slot)
  if st.host == nil or slot >= HOST_SLOT then return nil end
  return st.host.first + slot
end

local function dissect_control(tvb, off, tree, st, pinfo)
  local op = tvb(off + 2, 2):uint()
  local slot = tvb(off + 4, 2):uint()
  local ct = tree:add(aiogc, tvb(off, CTRL_BYTES))
  ct:add(F.ctrl_op, tvb(off + 2, 2))
  ct:add(F.slot, tvb(off + 4, 2))
  local w = worker_of(st, slot)
  if w ~= nil then ct:add(F.worker_id, tvb(off + 4, 2), w):set_generated() end
  local name = op == OPEN and "OPEN" or op == CLOSE and "CLOSE" or ("control op " .. op)
  local info = string.format("%s(slot=%d%s)", name, slot, w and (", worker=" .. w) or "")
  ct:set_text("aiogc " .. info)
  if (op ~= OPEN and op ~= CLOSE) or (st.host ~= nil and slot >= st.host.count) then
    ct:add_proto_expert_info(e_malformed, "bad control record (op or slot)")
  end
  if op == OPEN and not pinfo.visited then st.slots[slot] = {} end  -- a new session
  return info
end

-- ---------------------------------------------------------------------------- msgpack

local function mp_read(tvb, off)
  -- returns value (number / string / bool / nil / table for maps), display text, next offset,
  -- kind ("int", "str", "bin", "map", ...)
  local b = tvb(off, 1):uint()
  if b <= 0x7f then return b, tostring(b), off + 1, "int" end
  if b >= 0xe0 then return b - 256, tostring(b - 256), off + 1, "int" end
  if b >= 0x80 and b <= 0x8f then return b - 0x80, nil, off + 1, "map" end
  if b >= 0x90 and b <= 0x9f then return b - 0x90, nil, off + 1, "array" end
  if b >= 0xa0 and b <= 0xbf then
    local n = b - 0xa0
    local s = n > 0 and tvb(off + 1, n):string(ENC_UTF_8) or ""
    return s, '"' .. s .. '"', off + 1 + n, "str"
  end
  if b == 0xc0 then return nil, "nil", off + 1, "nil" end
  if b == 0xc2 then return false, "false", off + 1, "bool" end
  if b == 0xc3 then return true, "true", off + 1, "bool" end
  local function lenfield(size) return tvb(off + 1, size):uint() end
  if b == 0xc4 or b == 0xc5 or b == 0xc6 then
    local size = ({ [0xc4] = 1, [0xc5] = 2, [0xc6] = 4 })[b]
    local n = lenfield(size)
    local start = off + 1 + size
    local hex = n > 0 and tostring(tvb(start, n):bytes()) or ""
    return { start = start, len = n }, n .. " bytes " .. hex, start + n, "bin"
  end
  if b == 0xd9 or b == 0xda or b == 0xdb then
    local size = ({ [0xd9] = 1, [0xda] = 2, [0xdb] = 4 })[b]
    local n = lenfield(size)
    local start = off + 1 + size
    local s = n > 0 and tvb(start, n):string(ENC_UTF_8) or ""
    return s, '"' .. s .. '"', start + n, "str"
  end
  if b == 0xca then local v = tvb(off + 1, 4):float(); return v, tostring(v), off + 5, "float" end
  if b == 0xcb then local v = tvb(off + 1, 8):float(); return v, tostring(v), off + 9, "float" end
  if b >= 0xcc and b <= 0xcf then
    local size = ({ [0xcc] = 1, [0xcd] = 2, [0xce] = 4, [0xcf] = 8 })[b]
    local v = size == 8 and tvb(off + 1, 8):uint64():tonumber() or tvb(off + 1, size):uint()
    return v, tostring(v), off + 1 + size, "int"
  end
  if b >= 0xd0 and b <= 0xd3 then
    local size = ({ [0xd0] = 1, [0xd1] = 2, [0xd2] = 4, [0xd3] = 8 })[b]
    local v = size == 8 and tvb(off + 1, 8):int64():tonumber() or tvb(off + 1, size):int()
    return v, tostring(v), off + 1 + size, "int"
  end
  if b == 0xde then return tvb(off + 1, 2):uint(), nil, off + 3, "map" end
  if b == 0xdf then return tvb(off + 1, 4):uint(), nil, off + 5, "map" end
  if b == 0xdc then return tvb(off + 1, 2):uint(), nil, off + 3, "array" end
  if b == 0xdd then return tvb(off + 1, 4):uint(), nil, off + 5, "array" end
  error(string.format("msgpack type byte 0x%02x not used by aiogc", b))
end

-- One msgpack map at `off` (welcome's config) into `tree`; returns the next offset.
local function dissect_msgpack_map(tvb, off, tree)
  local n, _, pos, kind = mp_read(tvb, off)
  if kind ~= "map" then error("expected a msgpack map") end
  for _ = 1, n do
    local kstart = pos
    local key, _, vpos = mp_read(tvb, pos)
    local v, text, nxt, vkind = mp_read(tvb, vpos)
    if vkind == "map" or vkind == "array" then error("nested container in a config map") end
    local item = tree:add(F.text, tvb(kstart, nxt - kstart), tostring(v))
    item:set_text(tostring(key) .. ": " .. text)
    pos = nxt
  end
  return pos
end

-- The fields of `kind` from `pos` into `tree`, per FIELDS; returns the next offset and
-- { name = value } (for the info column and the stream state).
local function dissect_fields(tvb, pos, kind, tree)
  local values = {}
  for _, entry in ipairs(FIELDS[kind]) do
    local name, form = entry[1], entry[2]
    local start = pos
    if form == "payload" then
      local b = tvb(pos, 1):uint()
      local size = ({ [0xc4] = 1, [0xc5] = 2, [0xc6] = 4 })[b]
      if size == nil then error(name .. ": not a msgpack bin") end
      local nbytes = tvb(pos + 1, size):uint()
      local data = pos + 1 + size
      local dt = DTYPES[values.dtype] or { 1, "bytes" }
      local count = math.floor(nbytes / dt[1])
      local shown = {}
      for i = 0, math.min(count, 4) - 1 do
        local r = tvb(data + i * dt[1], dt[1])
        shown[#shown + 1] = dt[1] == 2 and tostring(r:le_uint())
                            or string.format("%.6g", r:le_float())
      end
      local item = tree:add(F[name], tvb(start, 1 + size + nbytes))
      item:set_text(string.format("%s: %d x %s, %d bytes: [%s%s]", name, count, dt[2], nbytes,
                                  table.concat(shown, ", "), count > 4 and ", ..." or ""))
      pos = data + nbytes
    elseif form == "uint_array" or form == "float_array" then
      local n, _, p, k = mp_read(tvb, pos)
      if k ~= "array" then error(name .. ": not a msgpack array") end
      local sub = tree:add(F[name], tvb(start, 1))
      local shown = {}
      for i = 1, n do
        local v, text, nxt = mp_read(tvb, p)
        if form == "uint_array" then
          sub:add(F.entry_uint, tvb(p, nxt - p), UInt64.new(v))
        else
          sub:add(F.entry_float, tvb(p, nxt - p), v)
        end
        if i <= 16 then
          shown[#shown + 1] = form == "uint_array" and text or string.format("%g", v)
        end
        p = nxt
      end
      local more = n > 16 and " ..." or ""
      sub:set_len(p - start)
      sub:set_text(name .. ": [" .. table.concat(shown, " ") .. more .. "] (" .. n .. " entries)")
      values[name] = table.concat(shown, " ") .. more
      pos = p
    elseif form == "map" then
      local n = mp_read(tvb, pos)
      local sub = tree:add(F[name], tvb(start, 1))
      pos = dissect_msgpack_map(tvb, pos, sub)
      sub:set_len(pos - start)
      sub:set_text(name .. ": map, " .. n .. " entries")
    else
      local v, text, nxt, k = mp_read(tvb, pos)
      local range = tvb(start, nxt - start)
      if form == "uint" or form == "dtype" then
        if k ~= "int" then error(name .. ": not an int") end
        tree:add(F[name], range, UInt64.new(v)):set_text(name .. ": " .. text)
      elseif form == "float" then
        if k ~= "float" and k ~= "int" then error(name .. ": not a float") end
        tree:add(F[name], range, v):set_text(name .. ": " .. text)
      elseif form == "bin" then
        if k ~= "bin" then error(name .. ": not a msgpack bin") end
        tree:add(F[name], range):set_text(name .. ": " .. text)
      else
        if k ~= "str" then error(name .. ": not a msgpack str") end
        tree:add(F[name], range, v):set_text(name .. ": " .. text)
      end
      values[name] = v
      pos = nxt
    end
  end
  return pos, values
end

local INFO_KEYS = { "epoch", "round", "attempt", "seq", "count", "worker", "status", "code",
                    "reason" }

local function summary(kind, values)
  local parts = {}
  for _, k in ipairs(INFO_KEYS) do
    local v = values[k]
    if v ~= nil and type(v) ~= "table" then
      local s = type(v) == "string" and v or string.format("%d", v)
      if #s > 40 then s = s:sub(1, 40) .. "..." end
      parts[#parts + 1] = k .. "=" .. s
    end
  end
  return KINDS[kind] .. "(" .. table.concat(parts, ", ") .. ")"
end

-- What a kind means for its session's tagging state (§2.1).
local function track(kind, values, st, pinfo, slot)
  if pinfo.visited then return end
  if kind == K_CHALLENGE and st.ps_port == nil then st.ps_port = pinfo.src_port end
  local ss = session(st, slot)
  if ss == nil then return end
  if kind == K_HELLO then
    local mac = values.mac
    ss.secret = mac ~= nil and type(mac) == "table" and mac.len > 0
    ss.w_tagged = ss.secret
  elseif kind == K_WELCOME then
    ss.ps_tagged = ss.secret == true
  end
end

-- One frame at `off` (its PDU is `len` bytes; `slot`: a host connection's record, whose
-- 2-byte slot comes first); returns the info text.
local function dissect_frame(tvb, off, len, tree, st, pinfo, slot)
  local pos = off
  local ft = tree:add(aiogc, tvb(off, len))
  local who = ""
  if slot ~= nil then
    ft:add(F.slot, tvb(off, SLOT_BYTES))
    local w = worker_of(st, slot)
    if w ~= nil then
      ft:add(F.worker_id, tvb(off, SLOT_BYTES), w):set_generated()
      who = "w" .. w .. " "
    elseif slot == HOST_SLOT then
      who = "host "
    else
      who = "slot " .. slot .. " "
    end
    if st.host ~= nil and slot ~= HOST_SLOT and slot >= st.host.count then
      ft:add_proto_expert_info(e_malformed, "slot beyond the host's block")
    end
    pos = off + SLOT_BYTES
  end
  local h = tvb(pos, 4):uint()
  local body = pos + 4
  local kind = tvb(body + 2, 1):uint()
  local name = KINDS[kind] or ("unknown kind " .. kind)
  ft:set_text("aiogc " .. who .. name)
  ft:add(F.body_len, tvb(pos, 4))
  ft:add(F.version, tvb(body + 1, 1))
  ft:add(F.kind, tvb(body + 2, 1))
  ft:add(F.kind_name, tvb(body + 2, 1), name)
  local values = {}
  local ok, err = pcall(function()
    local n = tvb(body, 1):uint() - 0x90
    if FIELDS[kind] == nil or n ~= #FIELDS[kind] + 2 then
      error(string.format("an array of %d values, expected [version, kind, fields...]", n))
    end
    local nxt
    nxt, values = dissect_fields(tvb, body + 3, kind, ft)
    if nxt ~= body + h then error("bytes after the msgpack array") end
  end)
  if not ok then ft:add_proto_expert_info(e_malformed, tostring(err)) end
  local after = body + h
  if off + len - after == TAG_BYTES then ft:add(F.tag, tvb(after, TAG_BYTES)) end
  track(kind, values, st, pinfo, slot)
  local info = who .. summary(kind, values)
  ft:append_text(": " .. summary(kind, values))
  return info
end

-- ---------------------------------------------------------------------------- stream layer

function aiogc.dissector(tvb, pinfo, tree)
  local len = tvb:len()
  local off = 0
  local st = stream_state(pinfo)
  local infos = {}
  -- the first pass's PDUs of this call (a packet may be dissected in several calls: its own
  -- bytes, a reassembled PDU, the bytes after it)
  local key = string.format("%d:%d:%d", pinfo.number, tvb:offset(), len)
  local seen = st.pdus[key]
  if seen == nil then seen = {}; if not pinfo.visited then st.pdus[key] = seen end end
  while off < len do
    local pdu = seen[off]
    local typ, need, slot
    if pdu ~= nil then
      typ, need, slot = pdu[1], pdu[2], pdu[3]
    else
      typ, need, slot = next_pdu(tvb, off, st, pinfo)
      if typ == "frame" and not looks_like_frame(tvb, off) then
        return 0  -- not (or no longer) aiogc: leave the bytes to others
      end
      if typ == "record" and not looks_like_frame(tvb, off + SLOT_BYTES) then
        local t = tree:add(aiogc, tvb(off, len - off))
        t:add_proto_expert_info(e_malformed, "host connection record without a frame")
        return len
      end
    end
    if need == nil then
      pinfo.desegment_offset = off
      pinfo.desegment_len = DESEGMENT_ONE_MORE_SEGMENT
      break
    end
    if off + need > len then
      pinfo.desegment_offset = off
      pinfo.desegment_len = off + need - len
      break
    end
    seen[off] = { typ, need, slot }
    if typ == "preamble" then
      infos[#infos + 1] = dissect_preamble(tvb, off, tree, st, pinfo)
    elseif typ == "control" then
      infos[#infos + 1] = dissect_control(tvb, off, tree, st, pinfo)
    else
      infos[#infos + 1] = dissect_frame(tvb, off, need, tree, st, pinfo, slot)
    end
    off = off + need
  end
  if #infos > 0 then
    pinfo.cols.protocol = "AIOGC"
    pinfo.cols.info = table.concat(infos, "; ")
  end
  return len
end

local function heuristic(tvb, pinfo, tree)
  if not aiogc.prefs.heuristic then return false end
  if not looks_like_frame(tvb, 0) and not looks_like_preamble(tvb, 0) then return false end
  pinfo.conversation = aiogc
  aiogc.dissector(tvb, pinfo, tree)
  return true
end

aiogc:register_heuristic("tcp", heuristic)
DissectorTable.get("tcp.port"):add_for_decode_as(aiogc)
"""


if __name__ == "__main__":
    sys.exit(main())
