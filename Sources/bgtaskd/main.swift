// SPDX-License-Identifier: Apache-2.0
import BGTaskDaemon
import Glibc

exit(DaemonMain.run(arguments: Array(CommandLine.arguments.dropFirst())))
