/* commands.h — the subcommands of dfm-train (argv[0] is the subcommand's name; return 0, DFM_OPTS_HELP
 * handled inside, or a DFM_E* code with the message set). */
#ifndef DFM_TRAINER_COMMANDS_H
#define DFM_TRAINER_COMMANDS_H

int cmd_pretrain(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_debug_state(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_dump_batches(int argc, char **argv);
int cmd_hidden(int argc, char **argv);
int cmd_teacher(int argc, char **argv);
int cmd_slots(int argc, char **argv);
int cmd_import_gguf(int argc, char **argv);

#endif
