/* SPDX-License-Identifier: Apache-2.0 */
/* The wire protocol's names and the client rules' numbers, as libbgtask uses them: a copy
 * of Sources/BGTaskProtocol (ErrorName, EventName, ClientRules), checked against it by
 * ProtocolTests (Tests/BGTaskClientTests/ProtocolTests.swift): one `#define NAME value` per
 * line. Not installed. */
#ifndef BGTASK_PROTOCOL_H
#define BGTASK_PROTOCOL_H

#define BGTASK_INTERFACE_APP "io.bgtaskd.App"

#define BGTASK_METHOD_SUBSCRIBE "Subscribe"
#define BGTASK_METHOD_BEGIN_TASK "BeginTask"
#define BGTASK_METHOD_END_TASK "EndTask"
#define BGTASK_METHOD_FINISH_BACKGROUND_TRANSITION "FinishBackgroundTransition"
#define BGTASK_METHOD_FINISH_WAKE "FinishWake"
#define BGTASK_METHOD_SUBMIT_TASK_REQUEST "SubmitTaskRequest"
#define BGTASK_METHOD_CANCEL_TASK_REQUEST "CancelTaskRequest"
#define BGTASK_METHOD_CANCEL_ALL_TASK_REQUESTS "CancelAllTaskRequests"
#define BGTASK_METHOD_SET_TASK_COMPLETED "SetTaskCompleted"

#define BGTASK_EVENT_SUBSCRIBED "subscribed"
#define BGTASK_EVENT_DID_ENTER_BACKGROUND "didEnterBackground"
#define BGTASK_EVENT_WILL_ENTER_FOREGROUND "willEnterForeground"
#define BGTASK_EVENT_TASK_GRANTED "taskGranted"
#define BGTASK_EVENT_TASK_DENIED "taskDenied"
#define BGTASK_EVENT_TASK_EXPIRING "taskExpiring"
#define BGTASK_EVENT_TASK_EXPIRED "taskExpired"
#define BGTASK_EVENT_DID_WAKE "didWake"
#define BGTASK_EVENT_LAUNCH_TASK "launchTask"

#define BGTASK_ERROR_NO_SUCH_TASK "io.bgtaskd.App.NoSuchTask"
#define BGTASK_ERROR_NO_BACKGROUND_TIME "io.bgtaskd.App.NoBackgroundTime"
#define BGTASK_ERROR_LIMIT_EXCEEDED "io.bgtaskd.App.LimitExceeded"
#define BGTASK_ERROR_STATE_NOT_WRITABLE "io.bgtaskd.App.StateNotWritable"
#define BGTASK_ERROR_INVALID_PARAMETER "org.varlink.service.InvalidParameter"
#define BGTASK_ERROR_PERMISSION_DENIED "org.varlink.service.PermissionDenied"
#define BGTASK_ERROR_TOO_MANY_PENDING_TASK_REQUESTS "io.bgtaskd.App.TooManyPendingTaskRequests"
#define BGTASK_ERROR_NO_SUCH_TASK_REQUEST "io.bgtaskd.App.NoSuchTaskRequest"

/* Nanoseconds (ClientRules). */
#define BGTASK_FINISH_MARGIN_NS 25000000ULL
#define BGTASK_RECONNECT_FIRST_NS 50000000ULL
#define BGTASK_RECONNECT_MAXIMUM_NS 1000000000ULL
#define BGTASK_RESTART_GRACE_NS 3000000000ULL
#define BGTASK_MAXIMUM_SECONDS 86400
#define BGTASK_MAXIMUM_MESSAGE_BYTES 1048576
#define BGTASK_MAXIMUM_PENDING_ENDS 4096

#endif
