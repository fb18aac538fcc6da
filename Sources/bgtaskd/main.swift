import BGTaskDaemon
import Glibc

exit(DaemonMain.run(arguments: Array(CommandLine.arguments.dropFirst())))
