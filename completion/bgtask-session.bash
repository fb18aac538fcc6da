# SPDX-License-Identifier: Apache-2.0
# bash completion for bgtask-session
_bgtask_session() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    case $prev in
        --socket|--config) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --compositor) COMPREPLY=($(compgen -W "auto sway wlr none" -- "$cur")); return ;;
        --set) COMPREPLY=($(compgen -W "FocusMode=visible FocusMode=focused BackgroundDelaySec= Compositor=" -- "$cur")); return ;;
    esac
    COMPREPLY=($(compgen -W "--socket --compositor --config --set --check-config --help --version" -- "$cur"))
}
complete -F _bgtask_session bgtask-session
