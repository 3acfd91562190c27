/*
 * <ukprobes/trace.h> - the kprobe-based event tracer of ukprobes, in the process.
 *
 * The tracer's files are those of the kernel's tracefs, addressed by their path relative
 * to its root (a leading "/sys/kernel/tracing/" is accepted too):
 *   kprobe_events, dynamic_events, kprobe_profile, error_log, tracing_on,
 *   available_events, available_tracepoints,
 *   buffer_size_kb, trace, trace_pipe, snapshot, events/enable,
 *   events/GRP/enable, events/GRP/EVENT/{enable,format,filter,id,trigger,hist}.
 * Reading gives the text `cat FILE` would; ukp_trace_write is `echo TEXT > FILE`,
 * ukp_trace_append `echo TEXT >> FILE`. Functions return 0 or a negative errno value
 * (-ENOENT: no such file or event, -EINVAL: a rejected definition, filter or trigger,
 * whose reason error_log holds, -EBUSY: clearing an enabled event).
 *
 * At start-up the agent applies the definitions in the environment variable UKP_EVENTS
 * (the kernel's kprobe_event= boot parameter: definitions separated by ';', the words
 * of each by ','; "\," is a comma inside a word), and enables them.
 *
 * This header is C-compatible.
 */
#ifndef UKPROBES_TRACE_H
#define UKPROBES_TRACE_H

#ifdef __cplusplus
extern "C" {
#endif

/* *out receives a malloc()ed, NUL-terminated copy of the file's text (free() it). */
int ukp_trace_read(const char *path, char **out);
int ukp_trace_write(const char *path, const char *text);
int ukp_trace_append(const char *path, const char *text);

/*
 * Consumes trace_pipe: waits up to timeout_ms (0: not at all) for the first record, then
 * returns at most max_bytes of whole lines in *out (malloc()ed; "" when none came).
 * ukp_trace_read("trace_pipe") is this call with a wait of one second.
 */
int ukp_trace_pipe_read(int timeout_ms, unsigned long max_bytes, char **out);

/*
 * 1 when the code that records an event's hit is lean (as ukp_lean_dispatch() says of
 * handlers): on the lean paths ukp_lean_dispatch() reports, an event's hit then saves
 * none of the vector state. 0 when it is not (builds with the sanitizers), or a
 * negative errno if the agent could not start.
 */
int ukp_trace_lean(void);

#ifdef __cplusplus
}
#endif

#endif /* UKPROBES_TRACE_H */
