# bash completion for bgtaskctl
_bgtaskctl() {
    local cur prev verbs
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    verbs="status apps tasks history monitor background foreground terminate expire policy wake requests launch reload run help"
    case $prev in
        --socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        background|foreground|terminate|expire|policy|wake|tasks|requests|launch)
            COMPREPLY=($(compgen -W "--unit $(ps -e -o pid= 2>/dev/null)" -- "$cur")); return ;;
        --unit)
            COMPREPLY=($(compgen -W "$(ls /sys/fs/cgroup/*.slice /sys/fs/cgroup/user.slice/*/user@*.service/app.slice 2>/dev/null | grep -E '\.(scope|service)$')" -- "$cur")); return ;;
        run) COMPREPLY=($(compgen -W "--name -- --help" -- "$cur")); return ;;
        help) COMPREPLY=($(compgen -W "$verbs" -- "$cur")); return ;;
    esac
    local word
    for word in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
        if [[ " $verbs " == *" $word "* ]]; then
            if [[ $cur == -* ]]; then
                COMPREPLY=($(compgen -W "--help" -- "$cur"))
            elif [[ $word == run ]]; then
                COMPREPLY=($(compgen -c -- "$cur"))
            fi
            return
        fi
    done
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--socket --user --system --json --no-legend --help --version" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$verbs" -- "$cur"))
    fi
}
complete -F _bgtaskctl bgtaskctl
