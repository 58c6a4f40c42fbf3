"""Instruction prompts for training and evaluating Medusa heads, composed from hand-written seeds.

Medusa heads are trained by self-distillation (Cai et al. 2024, Sec. 2.3.2): the base model answers
a set of prompts and the heads learn to predict its own next tokens. What matters is that the
prompts look like what a user asks a small chat model, and cover many kinds of answer (prose,
lists, code, numbers, translations), so that the heads see every style they will meet.

Every category below has hand-written instruction *templates* (the forms a question takes) and
hand-written *topics* (what it is about: a subject, a passage, a word problem, a coding task, a
sentence to translate). A prompt is one template filled with one topic, plus small slots
(a language, an audience, the numbers of a word problem). Composition is seeded and
deterministic; no network, no model, nothing downloaded.

The held-out set is split by TOPIC, not by prompt: a held-out topic's key phrase occurs in no
training prompt at all, so accept rates on it measure how heads generalise to unseen content.

    python -m medusa_lib.pipeline.prompts          # writes assets/data/{train,heldout}_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "assets" / "data"
TRAIN_PATH = DATA_DIR / "train_prompts.jsonl"
HELDOUT_PATH = DATA_DIR / "heldout_prompts.jsonl"
BENCH_PATH = DATA_DIR / "bench_prompts.jsonl"  # hand-written separately, not composed here
EXAMPLES_PATH = ROOT / "assets" / "examples.json"

PER_TOPIC = 10  # prompts composed from each topic (distinct templates / slot values)
HELDOUT_FRACTION = 0.15  # share of each category's topics kept out of training


@dataclass(frozen=True)
class Topic:
    key: str  # phrase the split is made by; occurs verbatim in every prompt built from this topic
    text: str  # what fills {topic}; may hold its own {slots} (word problems, puzzles)
    slots: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Category:
    name: str
    templates: tuple[str, ...]  # instruction forms, each with a {topic} field
    topics: tuple[Topic, ...]
    slots: dict = field(default_factory=dict)  # values for other fields: {lang}, {audience}, {name} ...


def R(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(range(lo, hi + 1))


def topics(*items) -> tuple[Topic, ...]:
    """A plain string is its own key; (key, text) or (key, text, slots) for anything longer."""
    return tuple(Topic(t, t) if isinstance(t, str) else Topic(*t) for t in items)


# {p1}, {p2}, {p3} in a topic are distinct people's names
NAMES = ("Alice", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kemi", "Leo",
         "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Yusuf", "Zoe")
PERSON = re.compile(r"p\d")

# ---------------------------------------------------------------------------------------------
# writing
WRITING = Category(
    "writing",
    templates=(
        "Write a short poem about {topic}.",
        "Write a haiku about {topic}.",
        "Write a short story of about 100 words about {topic}.",
        "Write the opening paragraph of a story about {topic}.",
        "Write a limerick about {topic}.",
        "Describe {topic} in one vivid paragraph.",
        "Write a short diary entry about {topic}.",
        "Write a {tone} paragraph about {topic}.",
        "Write a short story for young children about {topic}.",
        "Give me three creative titles for a story about {topic}.",
        "Write a four-line rhyming verse about {topic}.",
        "Write a short letter to a friend describing {topic}.",
        "Write a social media post about {topic} in under 50 words.",
    ),
    slots={"tone": ("funny", "sad", "hopeful", "mysterious", "cheerful", "nostalgic", "dramatic")},
    topics=topics(
        "a rainy afternoon in the city", "an old bicycle", "the first snowfall of winter",
        "a lost dog finding its way home", "a robot learning to paint", "a small bakery at dawn",
        "a summer thunderstorm", "a grandmother's garden", "a train journey through the mountains",
        "a forgotten letter in a drawer", "a cat who watches the stars", "the last day of summer vacation",
        "a busy morning market", "a dragon who is afraid of fire", "a quiet reading room",
        "the sea at midnight", "a child's first kite", "a secret treehouse",
        "an astronaut looking back at Earth", "a village festival", "moving to a new town",
        "a broken clock", "a friendship between a fox and a crow", "the smell of fresh bread",
        "a desert sunrise", "an empty playground", "a firefly in a jar",
        "a musician playing on a street corner", "a snowman that melts", "a hike to a waterfall",
        "a paper boat on a river", "a mysterious key", "a lonely whale",
        "a city during a power outage", "a field of sunflowers", "an old sailor's last voyage",
        "a birthday surprise", "a shy ghost", "a time traveler visiting the past",
        "autumn leaves falling", "a garden snail's big adventure", "a night around a campfire",
        "the full moon rising over the hills", "a stray kitten in the rain", "a hot air balloon ride",
    ),
)

# ---------------------------------------------------------------------------------------------
# roleplay
ROLEPLAY = Category(
    "roleplay",
    templates=(
        "Pretend you are {topic}. Introduce yourself in a few sentences.",
        "You are {topic}. Describe a typical day in your life.",
        "Act as {topic} and give me one piece of advice.",
        "Role-play as {topic}. A visitor asks what you love most about your work. Reply in character.",
        "Imagine you are {topic}. Write a short message to a new apprentice.",
        "Stay in character as {topic} and tell me what worries you most.",
        "You are {topic}. Tell me a short story from your past.",
        "As {topic}, describe what you can see around you right now.",
        "Pretend to be {topic} and answer this: what is the hardest part of your job?",
        "Speak as {topic} and give a short pep talk to {group}.",
        "Write a short dialogue between {topic} and a curious child.",
        "You are {topic}. Someone says they want your job one day. What do you tell them?",
    ),
    slots={"group": ("a class of students", "a nervous beginner", "a group of tired volunteers", "your team", "a crowd of young fans")},
    topics=topics(
        "a pirate captain", "a medieval knight", "a friendly librarian", "a detective in 1920s London",
        "a tour guide in Rome", "a chef in a busy restaurant", "an astronaut on the International Space Station",
        "a wise old wizard", "a zookeeper", "a park ranger in Yellowstone", "a museum guide",
        "a barista in a small café", "a farmer during harvest season", "a ship's navigator",
        "a Roman soldier", "a fashion designer", "a mountain guide in the Alps", "a jazz musician",
        "a robot butler", "a dragon guarding treasure", "a time-traveling historian",
        "a kindergarten teacher", "a marine biologist", "a firefighter", "a weather reporter during a storm",
        "a video game hero", "an ancient Egyptian scribe", "a shopkeeper in a magic shop",
        "a football coach at halftime", "a personal fitness trainer", "a beekeeper", "a train conductor",
        "a Viking explorer", "a famous painter", "a circus ringmaster", "an airline pilot",
        "a flower shop owner", "a cowboy in the Old West", "a royal chef", "a submarine captain",
        "a mail carrier", "a lifeguard", "a lighthouse keeper", "a toy maker", "a night watchman at a castle",
    ),
)

# ---------------------------------------------------------------------------------------------
# reasoning: logic puzzles and riddles; {p1} {p2} {p3} are distinct names
REASONING = Category(
    "reasoning",
    templates=(
        "{topic}",
        "{topic} Explain your reasoning.",
        "Think step by step: {topic}",
        "Here is a puzzle: {topic}",
        "{topic} Answer in one sentence, then explain why.",
        "Logic question: {topic}",
        "Can you solve this? {topic}",
        "{topic} Walk me through your thinking.",
        "Try this brain teaser: {topic}",
        "{topic} Be careful, it might be a trick question.",
    ),
    topics=topics(
        ("is older than", "{p1} is older than {p2}. {p3} is younger than {p2}. Who is the oldest?"),
        ("is taller than", "{p1} is taller than {p2}, and {p2} is taller than {p3}. Who is the shortest of the three?"),
        ("widgets", "If it takes 5 machines 5 minutes to make 5 widgets, how long would it take 100 machines to make 100 widgets?"),
        ("a bat and a ball", "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost?"),
        ("sisters does her brother have", "{p1} is a girl with three sisters and one brother. How many sisters does her brother have?"),
        ("bloops", "If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies?"),
        ("all but 9", "A farmer has 17 sheep and all but 9 run away. How many sheep are left?"),
        ("kilogram of feathers", "Which is heavier: a kilogram of feathers or a kilogram of iron?"),
        ("sits to the left of", "{p1} sits to the left of {p2}, and {p3} sits to the right of {p2}. Who sits in the middle?"),
        ("day of the week will it be", "If today is {day}, what day of the week will it be {n} days from now?",
         {"day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"), "n": (3, 9, 10, 15, 20, 30, 100)}),
        ("every label is wrong", "There are three boxes labeled apples, oranges, and mixed, and every label is wrong. You may take one fruit from one box. Which box should you pick from to relabel all the boxes correctly?"),
        ("always lies", "{p1} always tells the truth and {p2} always lies. {p2} says, 'I always tell the truth.' Is that statement true or false?"),
        ("all black things absorb heat", "If some cats are black and all black things absorb heat, must some cats absorb heat?"),
        ("snail climbs", "A snail climbs 3 meters up a 10-meter well each day and slips back 2 meters each night. On which day does it reach the top?"),
        ("5-liter jug", "You have a 3-liter jug and a 5-liter jug. How can you measure exactly 4 liters of water?"),
        ("comes next in the sequence", "What number comes next in the sequence {seq}?",
         {"seq": ("2, 4, 8, 16", "3, 6, 9, 12", "1, 4, 9, 16", "5, 10, 20, 40", "1, 1, 2, 3, 5, 8", "100, 90, 80, 70", "2, 3, 5, 7, 11", "1, 3, 6, 10")}),
        ("rearrange the letters", "If you rearrange the letters of the word '{word}', what other English word can you make?",
         {"word": ("LISTEN", "HEART", "NIGHT", "STOP", "EVIL", "DUSTY", "ACT", "RACE")}),
        ("was born before", "{p1} was born before {p2}, and {p2} was born before {p3}. Was {p1} born before {p3}?"),
        ("three pills", "A doctor gives you three pills and tells you to take one every half hour. How long will the pills last?"),
        ("what is a greenhouse made of", "If a red house is made of red bricks and a blue house is made of blue bricks, what is a greenhouse made of?"),
        ("two fathers and two sons", "Two fathers and two sons go fishing and each catches one fish. They bring home only three fish, yet none were lost. How is that possible?"),
        ("more stickers than", "{p1} has more stickers than {p2} but fewer than {p3}. Who has the most stickers?"),
        ("no reptiles have fur", "If no reptiles have fur and all snakes are reptiles, can a snake have fur?"),
        ("the ground gets wet", "Is this argument valid? 'If it rains, the ground gets wet. The ground is wet. Therefore, it rained.'"),
        ("does not belong", "Which word does not belong in this group: {group}?",
         {"group": ("apple, banana, carrot, grape", "piano, violin, guitar, hammer", "red, blue, green, circle", "Paris, London, Tokyo, Africa", "Monday, Friday, April, Sunday", "eagle, sparrow, penguin, salmon")}),
        ("each own one pet", "{p1}, {p2}, and {p3} each own one pet: a cat, a dog, and a parrot. {p1} does not own the dog. {p2} owns the parrot. Who owns the cat?"),
        ("three light switches", "Three light switches outside a closed room control one bulb inside. You may enter the room only once. How can you find out which switch controls the bulb?"),
        ("the person in second place", "If you are running a race and you pass the person in second place, what place are you in?"),
        ("subtract 10 from 100", "How many times can you subtract 10 from 100?"),
        ("bury the survivors", "If a plane crashes exactly on the border between two countries, where do they bury the survivors?"),
        ("takes 15 minutes by bike", "{p1} leaves home at 8:00 and walks 30 minutes to school. {p2} leaves at 8:10 and takes 15 minutes by bike. Who arrives first?"),
        ("play chess", "In a class, every student plays chess or soccer or both. 12 play chess, 15 play soccer, and 5 play both. How many students are in the class?"),
        ("next letter in the pattern", "What is the next letter in the pattern {letters}?",
         {"letters": ("A, C, E, G", "Z, Y, X, W", "A, B, D, G", "B, D, F, H", "A, E, I, M")}),
        ("is the father of", "{p3} is the father of {p1}, and {p1} is the mother of {p2}. How is {p3} related to {p2}?"),
        ("rooster lays an egg", "A rooster lays an egg on the peak of a roof. Which side does the egg roll down?"),
        ("this sentence is false", "Is the sentence 'This sentence is false' true or false?"),
        ("three cats catch three mice", "If three cats catch three mice in three minutes, how many cats are needed to catch 100 mice in 100 minutes?"),
        ("only go outside if it is sunny", "{p1} says, 'I will only go outside if it is sunny.' {p1} went outside. Can we conclude that it was sunny?"),
        ("matching pair", "A drawer holds 4 red socks and 4 blue socks. In the dark, how many socks must you take to be sure of a matching pair?"),
        ("heavier than the", "Of three bags, the green one is heavier than the yellow one, and the yellow one is heavier than the white one. Which bag is the lightest?"),
        ("finished the race before", "{p1} finished the race before {p2} but after {p3}. Who finished first?"),
        ("coin is flipped", "A fair coin is flipped five times and lands heads each time. What is the chance it lands heads on the sixth flip?"),
    ),
)

# ---------------------------------------------------------------------------------------------
# math: word problems with varied numbers; {name} is any name
MATH = Category(
    "math",
    templates=(
        "{topic}",
        "Solve this math problem: {topic}",
        "{topic} Show your work step by step.",
        "Can you help me with this? {topic}",
        "{topic} Explain how you got the answer.",
        "Math question: {topic}",
        "{topic} Please give a short explanation.",
        "Work through this carefully: {topic}",
        "I'm stuck on this homework problem: {topic}",
        "{topic} Give the final answer at the end.",
    ),
    slots={"name": NAMES},
    topics=topics(
        ("notebooks that cost", "{name} buys {a} notebooks that cost ${b} each. How much does {name} spend in total?", {"a": R(2, 12), "b": R(2, 9)}),
        ("equal slices", "A pizza is cut into {a} equal slices. {name} eats {b} of them. What fraction of the pizza is left?", {"a": (6, 8, 10, 12), "b": R(1, 5)}),
        ("a car travels at", "A car travels at {a} km/h for {b} hours. How far does it go?", {"a": (40, 45, 50, 60, 65, 70, 80, 90, 100), "b": (1.5, 2, 2.5, 3, 4, 5)}),
        ("percent of", "What is {a} percent of {b}?", {"a": (10, 15, 20, 25, 30, 40, 50, 75), "b": (40, 60, 80, 120, 200, 360, 500)}),
        ("solve for x", "Solve for x: {eq}.", {"eq": ("3x + 7 = 22", "5x - 4 = 21", "2x + 9 = 31", "7x - 5 = 44", "6x + 3 = 39", "9x - 12 = 60", "x/3 + 4 = 10", "2(x + 5) = 26", "8x + 2 = 5x + 20", "10 - 2x = 4", "3(x - 2) = 21")}),
        ("rectangle is", "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?", {"a": R(5, 20), "b": R(2, 9)}),
        ("the average of", "What is the average of {nums}?", {"nums": ("4, 8, 15, 16, 23", "10, 20, 30, 40", "7, 9, 11, 13, 15, 17", "85, 90, 78, 92", "3.5, 4.5, 6, 8", "12, 18, 24", "100, 250, 400", "2, 4, 6, 8, 10, 12, 14")}),
        ("beads", "A bag holds {a} red beads and {b} blue beads. If you pick one bead at random, what is the probability that it is red?", {"a": R(2, 9), "b": R(3, 11)}),
        ("on sale for", "A jacket costs ${a} and is on sale for {b}% off. What is the sale price?", {"a": (40, 50, 60, 80, 90, 120, 150), "b": (10, 15, 20, 25, 30, 40)}),
        ("apples and gives", "{name} has {a} apples and gives {b} of them to a friend, then buys {c} more. How many apples does {name} have now?", {"a": R(8, 20), "b": R(2, 7), "c": R(3, 12)}),
        ("how many minutes are in", "How many minutes are in {a} hours and {b} minutes?", {"a": R(2, 9), "b": (5, 10, 15, 20, 25, 30, 40, 45, 50)}),
        ("How many weeks will it take", "{name} saves ${a} every week. How many weeks will it take to save ${b}?", {"a": (5, 8, 10, 12, 15, 20, 25), "b": (60, 100, 120, 150, 200, 240, 300)}),
        ("two angles of a triangle", "Two angles of a triangle measure {a} degrees and {b} degrees. What is the third angle?", {"a": (30, 35, 40, 45, 50, 55, 60), "b": (50, 60, 65, 70, 75, 80, 85)}),
        ("square root of", "What is the square root of {a}?", {"a": (16, 25, 36, 49, 64, 81, 100, 121, 144, 169, 196, 225, 400)}),
        ("simplified fraction", "What is {f1} plus {f2}? Give the answer as a simplified fraction.", {"f1": ("1/2", "1/3", "2/5", "3/4", "1/6", "5/8"), "f2": ("1/4", "1/6", "1/3", "1/8", "2/3", "3/10")}),
        ("cups of flour", "A recipe uses {a} cups of flour to make {b} cookies. How many cups of flour are needed for {c} cookies?", {"a": (2, 3, 4), "b": (12, 16, 20, 24), "c": (36, 48, 60, 72)}),
        ("paint a fence", "If {a} workers can paint a fence in {b} hours, how long would it take {c} workers working at the same rate?", {"a": (2, 3, 4, 6), "b": (6, 8, 9, 12), "c": (3, 4, 6, 8, 12)}),
        ("travel toward each other", "Two trains start {d} km apart and travel toward each other at {a} km/h and {b} km/h. How long until they meet?", {"d": (150, 200, 240, 300, 360, 420), "a": (50, 60, 70, 80), "b": (40, 50, 60, 70)}),
        ("simple interest", "{name} puts ${a} in a savings account that pays {b}% simple interest per year. How much interest is earned after {c} years?", {"a": (500, 800, 1000, 1200, 2000, 2500), "b": (2, 3, 4, 5), "c": (2, 3, 4, 5)}),
        ("three consecutive integers", "The sum of three consecutive integers is {s}. What are the integers?", {"s": (33, 48, 57, 72, 84, 99, 111, 126, 150)}),
        ("pencils costs", "A pack of {a} pencils costs ${b}. What is the price of one pencil?", {"a": (4, 5, 6, 8, 10, 12), "b": ("2.40", "3", "4.80", "6", "7.20", "9")}),
        ("a radius of", "A circle has a radius of {a} cm. What are its area and circumference? Use 3.14 for pi.", {"a": R(2, 12)}),
        ("a prime number", "Is {a} a prime number? Explain why or why not.", {"a": (21, 29, 37, 39, 51, 53, 57, 61, 77, 83, 87, 91, 97, 101, 119)}),
        ("least common multiple", "What is the least common multiple of {a} and {b}?", {"a": (4, 6, 8, 9, 10, 12), "b": (6, 10, 14, 15, 16, 18)}),
        ("greatest common divisor", "What is the greatest common divisor of {a} and {b}?", {"a": (12, 18, 24, 36, 42, 48), "b": (30, 40, 54, 60, 84, 90)}),
        ("years younger", "{name} is {a} years old, and {name}'s brother is {b} years younger. How old will the brother be in {c} years?", {"a": R(12, 40), "b": R(2, 9), "c": R(3, 10)}),
        ("walking speed", "{name} walks {a} km in {b} minutes. What is the walking speed in km per hour?", {"a": (2, 3, 4, 5, 6), "b": (30, 40, 45, 50, 60, 75, 90)}),
        ("percentage increase", "The price of a concert ticket rose from {ab}. What is the percentage increase?", {"ab": ("$20 to $25", "$40 to $50", "$50 to $60", "$60 to $75", "$80 to $100", "$24 to $30", "$45 to $54", "$120 to $150")}),
        ("kilometers to meters", "Convert {a} kilometers to meters and {b} meters to centimeters.", {"a": (2, 3.5, 7, 12, 0.8, 4.25), "b": (3, 15, 0.6, 2.4, 9)}),
        ("to the power of", "What is {a} to the power of {b}?", {"a": R(2, 9), "b": (2, 3, 4, 5)}),
        ("square garden", "A square garden has a perimeter of {a} meters. How long is each side, and what is its area?", {"a": (16, 20, 24, 28, 36, 40, 48, 60)}),
        ("boys to girls", "The ratio of boys to girls in a class is {setup}. How many girls are in the class?", {"setup": ("2:3, and there are 30 students", "3:4, and there are 28 students", "1:2, and there are 24 students", "3:5, and there are 32 students", "4:5, and there are 27 students", "5:7, and there are 36 students")}),
        ("restaurant bill", "A restaurant bill comes to ${a}. How much is a {b}% tip, and what is the total?", {"a": (24, 36, 48, 60, 75, 85, 120), "b": (10, 15, 18, 20)}),
        ("to the nearest", "Round {x} to the nearest {place}.", {"x": ("3.14159", "27.586", "149.95", "0.0671", "1234.5678", "8.449"), "place": ("whole number", "tenth", "hundredth")}),
        ("sum of all whole numbers", "What is the sum of all whole numbers from 1 to {n}?", {"n": (10, 20, 25, 40, 50, 100)}),
        ("a movie starts at", "A movie starts at {t1} and ends at {t2}. How long is the movie?", {"t1": ("6:15 PM", "6:40 PM", "7:05 PM", "7:30 PM"), "t2": ("8:50 PM", "9:10 PM", "9:35 PM", "10:05 PM")}),
        ("two fair dice", "If you roll two fair dice, what is the probability that the sum is {s}?", {"s": R(2, 12)}),
        ("quarters and", "{name} has {a} quarters and {b} dimes. How much money is that in dollars?", {"a": R(3, 15), "b": R(2, 12)}),
        ("the median of", "What is the median of {nums}?", {"nums": ("3, 9, 4, 7, 1", "12, 5, 8, 20", "15, 11, 19, 13, 17, 21", "2, 8, 6, 4", "40, 10, 30, 50, 20")}),
        ("passengers are on the bus", "A bus has {a} passengers. At the first stop {b} get off and {c} get on. How many passengers are on the bus now?", {"a": R(18, 45), "b": R(3, 12), "c": R(2, 10)}),
        ("a base of", "What is the area of a triangle with a base of {a} cm and a height of {b} cm?", {"a": R(4, 16), "b": R(3, 12)}),
        ("hours a week", "{name} works {a} hours a week and earns ${b} per hour. How much does {name} earn in {c} weeks?", {"a": (10, 12, 15, 20, 25, 30), "b": (11, 12, 14, 15, 18, 20), "c": (2, 3, 4)}),
    ),
)

# ---------------------------------------------------------------------------------------------
# coding: small tasks in several languages
CODING = Category(
    "coding",
    templates=(
        "Write a {lang} function that {topic}.",
        "Show me a short {lang} example that {topic}.",
        "How would you write {lang} code that {topic}? Keep it brief.",
        "Write a {lang} function that {topic}, with a one-line comment explaining it.",
        "I'm learning {lang}. Can you write a small function that {topic}?",
        "Give me a simple {lang} solution: a function that {topic}.",
        "Write a {lang} function that {topic}. Include one example call.",
        "Implement a function in {lang} that {topic}.",
        "Write a {lang} snippet that {topic} and explain how it works in two sentences.",
        "Can you show me how to write a function that {topic} in {lang}?",
    ),
    slots={"lang": ("Python", "Python", "Python", "JavaScript", "Java", "C++", "Go", "Rust", "TypeScript", "C#", "Ruby")},
    topics=topics(
        "reverses a string", "checks whether a number is prime", "returns the largest number in a list",
        "counts the vowels in a string", "computes the factorial of a number", "returns the nth Fibonacci number",
        "checks whether a word is a palindrome", "removes duplicates from a list", "converts Celsius to Fahrenheit",
        "sums the even numbers in a list", "finds the second largest number in an array",
        "merges two sorted lists into one sorted list", "counts how many times each word appears in a sentence",
        "checks whether two strings are anagrams", "computes the GCD of two integers with Euclid's algorithm",
        "flattens a nested list", "performs binary search on a sorted array",
        "capitalizes the first letter of every word", "returns the average of an array of numbers",
        "checks whether a year is a leap year", "converts a binary string to an integer",
        "generates a random password of a given length", "reads a text file and counts its lines",
        "sorts a list of names alphabetically", "finds the common elements of two lists",
        "rotates an array to the right by k steps", "checks whether a string contains only digits",
        "returns the first non-repeating character in a string", "implements a simple stack with push and pop",
        "checks whether an email address has a valid basic format", "calculates the sum of the digits of an integer",
        "converts a number of seconds into hours, minutes and seconds", "implements bubble sort",
        "counts the number of words in a sentence", "transposes a matrix",
        "checks whether the parentheses in a string are balanced", "returns the squares of the numbers in a list",
        "finds the minimum and maximum of a list in one pass", "reverses the order of words in a sentence",
        "returns all prime numbers below n", "computes the running total of a list",
        "checks whether a list is sorted", "splits a list into chunks of size n",
        "counts how often each letter appears in a string", "computes the distance between two points",
        "finds the longest word in a sentence",
    ),
)

# ---------------------------------------------------------------------------------------------
# extraction: short news-like passages full of names, places, dates and numbers
EXTRACTION = Category(
    "extraction",
    templates=(
        "Read the text below and list every date and number it mentions.\n\n{topic}",
        "From the following text, extract the names of people, places, and organizations.\n\n{topic}",
        "Extract the key facts from this passage as a bulleted list:\n\n{topic}",
        "Return a JSON object with the people, places, and dates found in this text:\n\n{topic}",
        "Who is mentioned in the following passage, and what role does each person play?\n\n{topic}",
        "List the locations mentioned in this text: {topic}",
        "Pull out every number from this text and say what it refers to: {topic}",
        "Identify the main subject of this text and its three most important details: {topic}",
        "Text: {topic}\n\nQuestion: Which dates are mentioned, and what happened on each?",
        "Extract who, what, where, and when from this news item:\n\n{topic}",
    ),
    topics=topics(
        ("Brightwater Library", "On March 3, 2021, the Brightwater Library in Leeds reopened after an 18-month renovation. Head librarian Nadia Okafor said the building now holds 45,000 books and a new children's wing funded by the Harlow Foundation."),
        ("Kestrel Bikes", "Kestrel Bikes, a small company based in Utrecht, announced on June 12 that it will hire 30 new workers. Founder Pieter Jansen said sales of its electric cargo bikes doubled in 2023, reaching 12,000 units."),
        ("Lakeside Marathon", "The 15th Lakeside Marathon took place in Geneva on Sunday, October 8. Kenyan runner Joseph Mwangi won in 2 hours 9 minutes, while Swiss athlete Laura Meier set a course record in the women's race. About 6,500 runners took part."),
        ("Orchard Street Market", "The Orchard Street Market in Toronto will extend its hours starting May 1. Market manager Daniel Cho said 120 vendors now sell there every Saturday, up from 85 last year. The city council approved a $200,000 grant for new lighting."),
        ("Blue Heron Clinic", "Dr. Amara Singh opened the Blue Heron Clinic in Portland, Maine, in January 2022. The clinic treats about 40 patients a day and employs 11 nurses. In September it partnered with Maine Medical Center to offer free flu shots."),
        ("Sundial Robotics", "Sundial Robotics, founded by Elena Petrova and Marcus Lee in 2019, raised $8 million on February 20. The Austin-based startup builds robots that sort recycling, and its machines now operate in 14 cities across Texas and Oklahoma."),
        ("Copperfield School", "Students at Copperfield School in Dublin raised €4,300 for a local animal shelter during a bake sale on November 17. Principal Siobhan Murphy thanked the 210 students and 25 parents who volunteered."),
        ("Northwind Ferry", "The Northwind Ferry between Oban and the Isle of Mull was cancelled on December 2 because of storms. The operator said 350 passengers were affected and that service resumed at 7:30 a.m. the next day."),
        ("Ridgeway Observatory", "Astronomers at the Ridgeway Observatory in Arizona discovered a new comet on August 14, 2023. The team, led by Dr. Hannah Brooks, estimates the comet is about 3 kilometers wide and will pass closest to the Sun in April 2025."),
        ("Maple and Pine Café", "The Maple and Pine Café opened its second location in Vancouver on April 9. Owners Jin Park and Sofia Alvarez said they hired 12 baristas and will donate 5% of first-month sales to the Vancouver Food Bank."),
        ("Harbor Arts Festival", "The Harbor Arts Festival returns to Halifax from July 18 to July 21. Organizer Claire Dubois expects 20,000 visitors, 60 artists, and 15 live concerts. Tickets cost $12 for adults and are free for children under 10."),
        ("Greenfield Farm", "Greenfield Farm in Iowa harvested 2,400 tons of corn this autumn, its best year since 2015. Farmer Tom Becker credited new irrigation equipment bought in March with a loan from the Iowa Agricultural Bank."),
        ("Silverline Trains", "Silverline Trains will launch a new route between Madrid and Lisbon on September 1. The trip will take 4 hours and 50 minutes, and CEO Raúl Ortega said one-way tickets will start at €39."),
        ("Cedar Hill Museum", "The Cedar Hill Museum in Melbourne unveiled a collection of 2,000-year-old Roman coins on May 15. Curator Olivia Grant said the 320 coins were donated by collector Henry Walsh, who died in 2020."),
        ("Pinecrest Hospital", "Pinecrest Hospital in Denver welcomed its 10,000th baby on January 6. Parents Rachel and Omar Haddad named their daughter Lina. The hospital's maternity ward opened in 2008 and has 24 beds."),
        ("Tidewater Chess Club", "Twelve-year-old Arjun Mehta won the Tidewater Chess Club championship in Norfolk, Virginia, on March 25. He beat 48 other players, including defending champion Linda Carver, and will play at the state finals in June."),
        ("Redstone Bridge", "Work on the Redstone Bridge in Pittsburgh finished on October 30, two months ahead of schedule. The 420-meter bridge cost $95 million. Mayor Alan Foster said about 30,000 cars will cross it each day."),
        ("Aurora Theater", "The Aurora Theater in Reykjavik will stage a new play by writer Katrín Jónsdóttir from February 2 to March 10. The play has a cast of 9 actors, and director Gunnar Olafsson says opening night sold out in two days."),
        ("Willow Creek Park", "Volunteers planted 1,500 trees in Willow Creek Park in Sacramento on Saturday, April 22. The event was organized by the group Green Roots, led by Maria Gonzalez, with a $25,000 donation from River Bank."),
        ("Falcon Air", "Falcon Air will add daily flights from Nairobi to Cape Town starting August 5. The airline, led by CEO Grace Wanjiru, said the 4-hour flights will use new planes with 130 seats each."),
        ("Starlight Bakery", "The Starlight Bakery in Lyon won first prize for its croissants at the national pastry competition on June 3. Head baker Julien Moreau said the bakery sells about 900 croissants a day and employs 7 bakers."),
        ("Kiwi Coding Camp", "The Kiwi Coding Camp in Wellington taught 75 teenagers to build mobile apps during the July school holidays. Teacher Aroha Ngata said 20 of the students will present their apps at a showcase on August 12."),
        ("Summit Outdoor Gear", "Summit Outdoor Gear reported sales of $54 million in 2023, up 18% from the year before. The Seattle company, run by CEO Brian Howard, plans to open 6 new stores in Colorado and Utah next spring."),
        ("Riverbend Zoo", "The Riverbend Zoo in Nashville announced the birth of two snow leopard cubs on May 28. Zookeeper Emily Tran said the cubs, named Kira and Tashi, each weigh about 500 grams and will meet the public in August."),
        ("Hillside Community Garden", "The Hillside Community Garden in Cardiff now has 64 plots, up from 40 in 2020. Coordinator Owen Price said the waiting list has 90 names and that a greenhouse donated by Cardiff University will open on March 1."),
        ("Oakmont Fire Station", "Firefighters from Oakmont Fire Station rescued a family of four from a house fire on Elm Road at 2:15 a.m. on January 19. Captain Luis Ramirez said no one was seriously hurt and that smoke alarms saved lives."),
        ("Polaris Science Fair", "Sixteen-year-old Mei Chen won the Polaris Science Fair in Singapore on September 9 with a project on cleaning water with banana peels. She received a $5,000 scholarship. In total, 310 students entered."),
        ("Evergreen Bookshop", "Evergreen Bookshop, an independent shop in Edinburgh, celebrated its 50th anniversary on November 4. Owner Fiona Campbell, whose father opened the shop in 1973, said it now stocks over 30,000 titles."),
        ("Bayview Swim Team", "The Bayview Swim Team from San Diego won 11 medals at the state championships in Fresno on July 9. Coach Derek Wong said swimmer Priya Nair broke the state record in the 200-meter butterfly."),
        ("Granite Peak Resort", "Granite Peak Resort in Colorado opened for the ski season on November 25 after 90 centimeters of snow fell in one week. Manager Julia Novak said the resort expects 250,000 visitors by April and has hired 400 seasonal workers."),
        ("Lotus Tea Company", "The Lotus Tea Company of Hanoi signed a deal on March 14 to export 500 tons of green tea to Germany each year. Director Nguyen Van Minh said the deal is worth $6 million and will create 80 jobs."),
        ("Windmill Solar Project", "The Windmill Solar Project near Seville began producing power on June 21. The plant has 150,000 solar panels and can power about 60,000 homes, according to engineer Carmen Ruiz of the company SolEnergía."),
        ("Mapleton Town Council", "The Mapleton Town Council voted 7 to 2 on Tuesday, February 13, to build a new skate park. Councillor Rita Shaw said the park will cost $320,000 and should open by September."),
        ("Coral Bay Research Station", "Scientists at the Coral Bay Research Station in Western Australia counted 1,200 sea turtle nests this season, 300 more than last year. Marine biologist Dr. Sam Whitfield said warmer sand may be changing the turtles' behavior."),
        ("Ironwood Orchestra", "The Ironwood Orchestra of Chicago will perform Beethoven's Ninth Symphony on December 31 at Symphony Hall. Conductor Anna Kowalski said 85 musicians and a choir of 120 singers will take part."),
        ("Sunflower Daycare", "Sunflower Daycare in Manchester was rated outstanding by inspectors on October 12. Manager Aisha Rahman said the daycare looks after 58 children and plans to add an outdoor play area next summer."),
        ("Glacier Point Hotel", "The Glacier Point Hotel in Queenstown will close for renovations from May 1 to July 31. General manager Chris Taylor said the $3 million project will add 20 rooms and a rooftop restaurant."),
        ("Atlas Delivery", "Atlas Delivery, a courier company in Warsaw, started testing electric vans on April 3. Operations head Tomasz Nowak said 25 vans will be used in the first phase, cutting fuel costs by about 40%."),
        ("Moonrise Film Festival", "The Moonrise Film Festival in Busan screened 140 films from 32 countries between October 4 and October 13. The top prize went to director Kim Soo-ah for her film about a fishing village."),
        ("Thornbury Cricket Club", "Thornbury Cricket Club in Bristol celebrated its 100th season on May 6 with a match against a team of former players. Club president Graham Ellis said the club has 180 members, including 70 juniors."),
        ("Quayside Robotics League", "The Quayside Robotics League final was held in Aberdeen on March 9. A team of five students from Dyce Academy, coached by Fraser Mackay, won with a robot that stacked 36 blocks in two minutes."),
        ("Juniper Health Center", "The Juniper Health Center in Albuquerque hired 6 new doctors in February and extended its opening hours to 9 p.m. on weekdays. Director Teresa Lucero said the center now sees about 1,100 patients a month."),
    ),
)

# ---------------------------------------------------------------------------------------------
# stem: science, technology and maths concepts (noun phrases)
STEM = Category(
    "stem",
    templates=(
        "Explain {topic} to {audience}.",
        "What is the basic idea behind {topic}? Keep it short.",
        "Give a simple explanation of {topic} with one everyday example.",
        "Why does it matter to understand {topic}?",
        "Describe {topic} in three sentences.",
        "What is a common misconception about {topic}, and what is the truth?",
        "Write one quiz question about {topic} and then answer it.",
        "Use an analogy to explain {topic}.",
        "What are the key facts a student should remember about {topic}?",
        "Tell me three interesting facts about {topic}.",
        "How would a scientist explain {topic} in plain language?",
    ),
    slots={"audience": ("a 10-year-old", "a high school student", "a complete beginner", "someone with no science background", "a curious grandparent")},
    topics=topics(
        "photosynthesis", "the water cycle", "plate tectonics", "vaccines", "the speed of light", "black holes",
        "DNA replication", "Newton's third law of motion", "electric circuits", "the greenhouse effect",
        "chemical bonding", "the periodic table", "natural selection", "rechargeable batteries", "sound waves",
        "the immune system", "the force of gravity", "ocean tides", "the phases of the Moon",
        "magnets and magnetic fields", "the human heart", "cell division", "solar power", "binary numbers",
        "machine learning", "the Pythagorean theorem", "acids and bases", "friction", "climate change",
        "the solar system", "rainbows", "volcanic eruptions", "earthquakes", "the digestive system",
        "nuclear fusion in stars", "lift on an airplane wing", "antibiotic resistance", "the states of matter",
        "entropy", "internet routing", "semiconductors", "the carbon cycle", "basic probability",
        "atoms and molecules", "kinetic and potential energy", "the nervous system", "viruses and bacteria",
        "food webs",
    ),
)

# ---------------------------------------------------------------------------------------------
# humanities: history, philosophy, literature, art, economics
HUMANITIES = Category(
    "humanities",
    templates=(
        "Give a brief overview of {topic}.",
        "Why do historians and teachers consider {topic} important?",
        "Explain {topic} in simple terms for {audience}.",
        "What are the main ideas behind {topic}?",
        "Summarize {topic} in three sentences.",
        "What can people today learn from {topic}?",
        "How did {topic} influence later history or culture?",
        "Write three discussion questions about {topic}.",
        "What are two different ways people have viewed {topic}?",
        "Tell me three key facts about {topic}.",
        "Write a short paragraph about {topic} for a school report.",
    ),
    slots={"audience": ("a middle school student", "a curious adult", "someone new to the subject", "a high school class")},
    topics=topics(
        "the French Revolution", "the Renaissance", "the Industrial Revolution", "Stoic philosophy",
        "Shakespeare's Romeo and Juliet", "the fall of the Roman Empire", "the invention of the printing press",
        "the Silk Road", "impressionist painting", "the Cold War", "Confucianism", "the civil rights movement",
        "democracy in ancient Athens", "the Magna Carta", "the Harlem Renaissance", "Plato's allegory of the cave",
        "the invention of writing", "the Ottoman Empire", "the abolition of slavery", "Buddhism",
        "the Enlightenment", "Greek mythology", "supply and demand", "the Great Depression",
        "the age of exploration", "the Maya civilization", "baroque music", "existentialism",
        "the Meiji Restoration", "the Protestant Reformation", "the Mughal Empire", "the history of jazz",
        "the founding of the United Nations", "the ancient Olympic Games", "George Orwell's novel 1984",
        "the fall of the Berlin Wall", "utilitarianism", "women's suffrage", "the Aztec Empire",
        "the Byzantine Empire", "the American Revolution", "Homer's Odyssey", "social contract theory",
        "Mansa Musa and the Mali Empire", "the Dust Bowl",
    ),
)

# ---------------------------------------------------------------------------------------------
# summarization: short passages (news, stories, emails, reviews, explainers)
SUMMARIZATION = Category(
    "summarization",
    templates=(
        "Summarize the following text in one sentence:\n\n{topic}",
        "Write a two-sentence summary of this passage:\n\n{topic}",
        "Give a TL;DR of this text: {topic}",
        "Summarize this paragraph for a busy reader:\n\n{topic}",
        "What is the main point of this passage?\n\n{topic}",
        "Condense the following into three bullet points:\n\n{topic}",
        "Read this and give a short summary:\n\n{topic}",
        "Write a one-line headline and a one-sentence summary for this text:\n\n{topic}",
        "Summarize the text below in simple words a child could understand.\n\n{topic}",
        "Text: {topic}\n\nSummarize the text above in under 40 words.",
    ),
    topics=topics(
        ("four-day work week", "A company in New Zealand tested a four-day work week for eight weeks. Staff worked 32 hours instead of 40 but were paid the same. Managers reported that productivity stayed the same, while employees said they felt less stressed and more loyal to the company. After the trial, the company made the change permanent."),
        ("urban beekeeping", "Urban beekeeping has become popular in many cities. Rooftop hives can produce honey and help pollinate parks and gardens. However, experts warn that too many hives in one area can leave honeybees without enough flowers and may crowd out wild bees. They suggest planting more flowers before adding more hives."),
        ("the old cinema on Park Lane", "The old cinema on Park Lane closed in 2010 and stood empty for years. Last spring, a group of neighbors raised money to buy it. They repaired the roof, cleaned the seats, and reopened it as a community theater that shows classic films on weekends and hosts school plays during the week."),
        ("plastic straws", "Many restaurants have stopped giving out plastic straws. Supporters say this reduces waste that ends up in the ocean. Critics point out that straws are a very small part of plastic pollution and that paper straws can be less convenient. Some people with disabilities also rely on flexible plastic straws to drink."),
        ("walking meetings", "Some managers now hold walking meetings instead of sitting in a conference room. Walking together can make conversations feel more relaxed and can boost creative thinking. It also adds some exercise to the workday. The idea works best for small groups and for discussions that do not need slides or notes."),
        ("lost wallets", "In a large study, researchers handed in 17,000 lost wallets at banks, hotels, and offices in 40 countries. Surprisingly, wallets containing more money were more likely to be returned to their owners. The researchers concluded that people care about being honest and do not want to see themselves as thieves."),
        ("school garden program", "When a primary school started a school garden program, each class was given a small plot to grow vegetables. Teachers used the garden to teach science and math, such as measuring plant growth. By the end of the year, students were eating more vegetables at lunch, and parents asked for the program to continue."),
        ("email from Jordan", "Hi team, a quick email from Jordan. The client meeting has moved from Thursday to Friday at 10 a.m. Please send me your slides by Wednesday evening so I can combine them. Also, remember that the office will be closed on Monday for the holiday. Thanks!"),
        ("wireless earbuds", "Review: These wireless earbuds have excellent sound and a comfortable fit, and the battery lasts about eight hours. The charging case is small enough for any pocket. On the downside, the touch controls are too sensitive, and the microphone struggles in windy places. Overall, they are good value for the price."),
        ("octopuses", "Octopuses are remarkably intelligent animals. They can open jars, escape from tanks, and recognize individual people. Each of their eight arms contains many neurons, allowing the arms to react to touch and taste on their own. Scientists study octopuses to learn how intelligence can evolve in animals very different from us."),
        ("remote learning", "When schools switched to remote learning, many students struggled without face-to-face contact with teachers. Some lacked a quiet place to study or a reliable internet connection. Others enjoyed learning at their own pace. Researchers say the experience showed both the promise of online tools and the importance of in-person support."),
        ("Mount Everest", "Every climbing season, hundreds of people attempt to reach the top of Mount Everest. Over the years, climbers have left behind tents, oxygen bottles, and food packaging. Nepal now asks each climber to carry down several kilograms of waste or lose a deposit, and cleanup teams have removed many tons of trash."),
        ("the village well", "In a dry village, the only well began to run low. Instead of arguing, the villagers met and agreed on a plan: each family would take water at a set time, and everyone would help dig channels to collect rainwater. By the next summer, the new channels filled two large tanks, and the village well never ran dry again."),
        ("standing desks", "Standing desks have become common in offices. Sitting for long hours is linked to health problems, so standing for part of the day may help. However, standing all day can cause back and leg pain. Experts recommend switching between sitting and standing and taking a short walk every hour."),
        ("late fees", "Starting next month, the city library will no longer charge late fees. Officials said fines discouraged many families from borrowing books, especially children. Borrowers will still need to return or replace books before borrowing more. Other cities that removed fines saw more books come back, not fewer."),
        ("Antarctic krill", "Antarctic krill are tiny shrimp-like animals, but they are a key part of the ocean food chain. Whales, seals, penguins, and fish all depend on them. Krill feed on algae that grow under sea ice, so as the ice shrinks, krill numbers may fall. Scientists worry this could affect many other species."),
        ("a bakery owner named Rosa", "A bakery owner named Rosa noticed she was throwing away bread every evening. She started selling day-old loaves at half price and giving the rest to a shelter. Her customers liked the idea, her waste dropped to almost nothing, and the shelter now receives fresh bread five days a week."),
        ("electric scooters", "Electric scooters have appeared on the streets of many cities. They offer a cheap and quick way to travel short distances. But riders sometimes leave them blocking sidewalks, and injuries have increased. Several cities now require parking zones, speed limits, and helmets for young riders."),
        ("Great Barrier Reef", "The Great Barrier Reef off the coast of Australia is the world's largest coral reef system. Rising sea temperatures have caused several mass bleaching events, in which corals lose the algae that give them color and food. Some reefs recover when waters cool, but repeated bleaching makes recovery harder."),
        ("new bus schedule", "Notice to residents: the new bus schedule begins on June 1. Route 5 will run every 10 minutes during rush hour instead of every 20. Route 9 will be replaced by a shuttle that stops at the hospital and the university. Night buses will continue to run on Fridays and Saturdays only."),
        ("took notes by hand", "A study found that students who took notes by hand remembered lectures better than those who typed. Typing allowed students to write down more words, but they often copied what they heard without thinking. Writing by hand forced them to summarize ideas in their own words, which helped them learn."),
        ("our hiking trip", "Our hiking trip did not go as planned. It rained all morning, the trail was muddy, and we took a wrong turn at the river. But in the afternoon the clouds cleared, and we reached a lake we had never seen before. We ate our sandwiches by the water and agreed it was the best mistake we ever made."),
        ("vertical farms", "Vertical farms grow vegetables indoors on stacked shelves under LED lights. They use far less water and land than traditional farms and can be built in cities close to customers. However, they need a lot of electricity, which makes their food expensive. Most vertical farms today grow leafy greens and herbs."),
        ("night event", "Last Friday, the science museum's night event attracted more than 2,000 adults. Visitors could try experiments, listen to short talks, and watch a planetarium show. Organizers said the event helped reach people who rarely visit museums, and they plan to hold it every month."),
        ("waggle dance", "Honeybees use a movement called the waggle dance to tell other bees where to find food. The direction of the dance shows the direction of the flowers compared to the sun, and the length of the dance shows how far away they are. This discovery earned the scientist Karl von Frisch a Nobel Prize."),
        ("blue kettle", "Dear Support Team, I am writing about my recent order. I ordered a blue kettle on May 3, but I received a red toaster instead. I have attached a photo of the package. Please send the correct item or refund my money. I would appreciate a reply within a week. Sincerely, Paula Reyes."),
        ("Roger Bannister", "For many years, people believed that running a mile in under four minutes was impossible. In 1954, Roger Bannister ran it in 3 minutes 59.4 seconds. Within a few years, many other runners had also broken the barrier. His achievement is often used to show how beliefs about limits can change."),
        ("microplastics", "Microplastics are tiny pieces of plastic smaller than five millimeters. They come from broken-down bottles, synthetic clothing, and car tires. They have been found in oceans, soil, drinking water, and even human blood. Scientists are still studying how they affect health."),
        ("robot vacuum", "We bought a robot vacuum hoping to save time. For the first week, it got stuck under the sofa, ate a sock, and chased the dog. After we cleared the floor and set up no-go zones in the app, it started working well. Now it cleans every morning while we are at work."),
        ("two-minute rule", "The two-minute rule is a simple productivity idea: if a task takes less than two minutes, do it right away. Small jobs like answering a short message or putting away dishes are finished before they pile up. The rule also helps people start bigger habits by beginning with a two-minute version."),
        ("Venice", "Venice, Italy, is built on more than 100 small islands in a lagoon. The city is famous for its canals, bridges, and historic buildings. However, rising water levels and frequent flooding threaten the city. A system of movable barriers, called MOSE, now rises to protect Venice during high tides."),
        ("tool library", "The neighborhood tool library lets residents borrow drills, ladders, and garden tools for free instead of buying them. Members donate tools they rarely use, and volunteers keep track of loans. Since it opened, the tool library has lent more than 3,000 items and helped neighbors get to know each other."),
        ("the tortoise and the hare", "In the fable of the tortoise and the hare, a fast hare mocks a slow tortoise and agrees to a race. Sure of winning, the hare takes a nap halfway. The tortoise keeps walking steadily and crosses the finish line first. The story teaches that steady effort can beat talent without discipline."),
        ("caffeine", "Caffeine is the most widely used stimulant in the world, found in coffee, tea, and many soft drinks. It blocks a brain chemical called adenosine that makes us feel tired. Moderate amounts can improve alertness, but too much can cause anxiety and poor sleep. Its effects can last for up to six hours."),
        ("first marathon", "The town's first marathon almost did not happen. Two weeks before race day, the main sponsor pulled out. Local shops, schools, and families stepped in, donating water, medals, and food. On the day, 800 runners finished the race, and the mayor promised it would become a yearly event."),
        ("online reviews", "Many people read online reviews before buying products or booking hotels. Reviews can be helpful, but some are fake, written by companies or paid reviewers. Experts advise reading several reviews, looking for specific details, and being careful with products that have only perfect ratings."),
        ("Rosetta Stone", "The Rosetta Stone, discovered in Egypt in 1799, contains the same text written in three scripts: hieroglyphs, Demotic, and ancient Greek. Because scholars could read Greek, they used the stone to decode Egyptian hieroglyphs. Jean-François Champollion announced his breakthrough in 1822."),
        ("community fridges", "Community fridges are public refrigerators where anyone can leave or take food for free. They help reduce food waste and support people who cannot afford groceries. Volunteers clean the fridges and check that the food is safe. The idea has spread to hundreds of cities around the world."),
        ("apprentice carpenter", "The apprentice carpenter spent his first month only sanding wood. Frustrated, he asked his teacher when he would build real furniture. The teacher handed him a chair and asked him to feel its smooth surface. 'Every great piece starts here,' she said. The apprentice went back to sanding with new patience."),
        ("blue light", "Phones and laptops give off blue light, which can signal to the brain that it is still daytime. Using screens late at night may delay the release of melatonin, the hormone that helps us fall asleep. Doctors suggest putting devices away an hour before bed or using night mode settings."),
        ("city orchard", "Three years ago, volunteers planted forty fruit trees in an empty lot behind the train station. Today the city orchard produces apples, pears, and plums that anyone may pick. Local schools visit in autumn to learn about pollination, and a small committee organizes pruning days every spring."),
    ),
)

# ---------------------------------------------------------------------------------------------
# translation: everyday English sentences into common languages
TRANSLATION = Category(
    "translation",
    templates=(
        'Translate this sentence into {lang}: "{topic}"',
        'How do you say "{topic}" in {lang}?',
        "Translate to {lang}: {topic}",
        "Please translate the following English text into {lang}.\n\n{topic}",
        'What is the {lang} translation of "{topic}"?',
        'Translate "{topic}" into {lang} and explain any tricky words.',
        "Give me the {lang} version of this sentence: {topic}",
        'I need this in {lang}, please: "{topic}"',
        'Translate "{topic}" into {lang}, then give a word-by-word breakdown.',
        'Translate into {lang} using a polite, formal tone: "{topic}"',
    ),
    slots={"lang": ("French", "Spanish", "German", "Italian", "Portuguese")},
    topics=topics(
        "Where is the nearest train station?", "I would like a cup of coffee, please.", "The weather is beautiful today.",
        "My brother works at a hospital.", "Can you help me find my keys?", "We are going to the beach this weekend.",
        "How much does this book cost?", "I have been learning to play the guitar for two years.",
        "The museum opens at nine in the morning.", "Please close the window, it is cold.",
        "She reads the newspaper every morning.", "Thank you for inviting me to dinner.", "What time does the film start?",
        "I lost my umbrella on the bus.", "Our teacher gave us a lot of homework.", "The children are playing in the garden.",
        "Could you speak more slowly, please?", "I am allergic to peanuts.", "This soup is too salty.",
        "Happy birthday! I hope you have a wonderful day.", "The store is closed on Sundays.",
        "I need to buy a new pair of shoes.", "My favorite season is spring.", "Excuse me, where is the bathroom?",
        "He missed the last bus home.", "Do you know a good restaurant nearby?", "I will call you tomorrow afternoon.",
        "The hotel room has a view of the sea.", "We should leave early to avoid traffic.",
        "My grandmother makes the best apple pie.", "Learning a new language takes patience.",
        "The meeting has been moved to Friday.", "Is this seat taken?", "I forgot my password again.",
        "Turn left at the second traffic light.", "The cat is sleeping on the sofa.", "How long have you lived in this city?",
        "Please send me the report by email.", "I would like to book a table for two.",
        "The library is next to the post office.", "My phone battery is almost empty.",
        "We watched the sunset from the hill.", "Where can I buy a ticket?", "This is my first time visiting Japan.",
        "The bakery sells fresh bread every morning.",
    ),
)

# ---------------------------------------------------------------------------------------------
# advice / how-to: verb phrases ("How can I ...?")
ADVICE = Category(
    "advice",
    templates=(
        "How can I {topic}?",
        "Give me five practical tips to {topic}.",
        "What is the best way to {topic}?",
        "I want to {topic}. Where should I start?",
        "List three common mistakes people make when they try to {topic}.",
        "Give me a simple step-by-step plan to {topic}.",
        "My friend wants to {topic}. What advice would you give them?",
        "What are some beginner tips to {topic}?",
        "Explain briefly how to {topic}.",
        "Write a short checklist for someone who wants to {topic}.",
    ),
    topics=topics(
        "improve my sleep", "save money on groceries", "prepare for a job interview", "learn a new language faster",
        "start running as a beginner", "keep houseplants alive", "stay focused while studying",
        "reduce stress before exams", "organize a small closet", "make new friends in a new city",
        "write a good cover letter", "cook healthy meals on a budget", "start a vegetable garden",
        "speak confidently in public", "stop procrastinating", "plan a trip on a budget",
        "take better photos with my phone", "keep a conversation going", "build a habit of reading every day",
        "manage my time better at work", "train a puppy to sit", "reduce my screen time", "prepare for a long hike",
        "make my home more energy efficient", "learn to play the piano as an adult", "drink more water during the day",
        "give constructive feedback to a coworker", "stay motivated to exercise", "study for a math test",
        "start journaling", "negotiate a higher salary", "keep my kitchen clean", "choose a good laptop for school",
        "help a friend who is feeling sad", "write a clear email", "memorize a speech", "wake up earlier",
        "pack light for a weekend trip", "set a monthly budget", "be a better listener", "learn to code on my own",
        "protect my online accounts", "decorate a small apartment", "make a good first impression",
        "unwind after a long day at work",
    ),
)

# ---------------------------------------------------------------------------------------------
# qa / explanation: everyday "why" and "how" questions
QA = Category(
    "qa",
    templates=(
        "{topic}",
        "Quick question: {topic}",
        "{topic} Please answer in a few sentences.",
        "Can you explain this simply? {topic}",
        "I've always wondered: {topic}",
        "{topic} Give a short answer and one interesting fact.",
        "Explain like I'm five: {topic}",
        "Answer briefly: {topic}",
        "{topic} Keep the answer under 100 words.",
        "My kid asked me this and I didn't know: {topic}",
    ),
    topics=topics(
        "Why is the sky blue?", "How do bees make honey?", "Why do cats purr?", "What causes hiccups?",
        "Why do we have leap years?", "How does a refrigerator keep food cold?", "Why do onions make you cry?",
        "Why do leaves change color in autumn?", "What makes popcorn pop?", "How do fish breathe underwater?",
        "Why do we yawn?", "How does a compass work?", "Why is the ocean salty?",
        "What is the tallest mountain in the world?", "How do bats find their way in the dark?",
        "Why do stars twinkle?", "How does soap clean our hands?", "Why do we dream?",
        "How do chameleons change color?", "What is the difference between weather and climate?",
        "Why do some animals hibernate?", "How are clouds formed?", "Why does bread rise?",
        "How do noise-cancelling headphones work?", "Why do we get goosebumps?",
        "What is the largest desert on Earth?", "How does a microwave oven heat food?", "Why do birds migrate?",
        "What is the difference between a frog and a toad?", "How do elevators work?", "Why does ice float on water?",
        "How does a credit card work?", "Why do our fingers wrinkle in water?",
        "Where does the word 'robot' come from?", "How do plants know which way is up?", "Why do we have time zones?",
        "How does GPS know where I am?", "Why is gold so valuable?", "How do vending machines recognize coins?",
        "Why do dogs wag their tails?", "What is a calorie?", "Why do we need sleep?",
        "How do glasses help people see better?", "Why do mosquitoes bite some people more than others?",
        "How do seeds know when to sprout?",
    ),
)

CATEGORIES: tuple[Category, ...] = (WRITING, ROLEPLAY, REASONING, MATH, CODING, EXTRACTION, STEM, HUMANITIES, SUMMARIZATION, TRANSLATION, ADVICE, QA)


# ---------------------------------------------------------------------------------------------
# composition


def _fields(text: str) -> list[str]:
    """Named {fields} of a format string, in order, without repeats (never a set: hash order varies)."""
    return list(dict.fromkeys(name for _, name, _, _ in string.Formatter().parse(text) if name))


def _fill(text: str, slots: dict, rng: random.Random, **fixed) -> str:
    """Format ``text``; {p1} {p2} ... get distinct names, other fields a random value from ``slots``."""
    values = dict(fixed)
    fields = [f for f in _fields(text) if f not in values]
    people = [f for f in fields if PERSON.fullmatch(f)]
    values.update(zip(people, rng.sample(NAMES, len(people))))
    for f in fields:
        if f not in values:
            values[f] = rng.choice(slots[f])
    return text.format(**values)


def compose_category(cat: Category, *, seed: int = 0, per_topic: int = PER_TOPIC) -> list[dict]:
    """``per_topic`` distinct prompts for each topic of ``cat``, cycling through its templates."""
    rng = random.Random(f"compose:{seed}:{cat.name}")
    out: list[dict] = []
    for topic in cat.topics:
        order = list(cat.templates)
        rng.shuffle(order)
        seen: set[str] = set()
        for i in range(per_topic * 50):
            if len(seen) == per_topic:
                break
            text = _fill(topic.text, {**cat.slots, **topic.slots}, rng)
            prompt = _fill(order[i % len(order)], cat.slots, rng, topic=text)
            if prompt not in seen:
                assert topic.key.lower() in prompt.lower(), (cat.name, topic.key)  # the split relies on it
                seen.add(prompt)
                out.append({"category": cat.name, "topic": topic.key, "prompt": prompt})
        if len(seen) < per_topic:
            raise ValueError(f"{cat.name}: topic {topic.key!r} gives only {len(seen)} distinct prompts; add templates or slot values")
    rng.shuffle(out)  # so a prefix of the file still covers many topics
    return out


def compose_prompts(seed: int = 0, *, per_topic: int = PER_TOPIC) -> list[dict]:
    """All prompts, category by category: ``{"category", "topic", "prompt"}`` (no ids, no split yet)."""
    keys = [t.key.lower() for c in CATEGORIES for t in c.topics]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"topic keys must be unique across categories; repeated: {dupes}")
    return [p for cat in CATEGORIES for p in compose_category(cat, seed=seed, per_topic=per_topic)]


def key_pattern(key: str) -> re.Pattern:
    """``key`` as a whole phrase, any case ("friction" matches "Friction," but not "frictionless")."""
    return re.compile(r"(?<!\w)" + re.escape(key) + r"(?!\w)", re.IGNORECASE)


def split_prompts(prompts: list[dict], *, heldout_fraction: float = HELDOUT_FRACTION, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Split by topic: ``(train, heldout)``, with ids like ``train-writing-0001``.

    A share ``heldout_fraction`` of each category's topics (seeded pick) is held out; a held-out
    topic whose key phrase still occurs in some training prompt (another category's passage may
    mention it) is moved back to training, until no held-out key occurs in any training prompt.
    Order within each category is kept, so splitting the output again gives the same result.
    """
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be between 0 and 1, got {heldout_fraction}")
    by_cat: dict[str, list[dict]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], []).append(p)
    held: set[tuple[str, str]] = set()
    for cat, rows in by_cat.items():
        keys = sorted({p["topic"] for p in rows})
        random.Random(f"split:{seed}:{cat}").shuffle(keys)
        held.update((cat, k) for k in keys[: max(1, round(heldout_fraction * len(keys)))])
    while True:  # move leaking held-out topics to train until none leak
        train_text = "\n".join(p["prompt"] for p in prompts if (p["category"], p["topic"]) not in held)
        lower = train_text.lower()
        leaking = {ck for ck in held if ck[1].lower() in lower and key_pattern(ck[1]).search(train_text)}
        if not leaking:
            break
        held -= leaking
    train, heldout = [], []
    for cat, rows in by_cat.items():
        for split, bucket in (("train", train), ("heldout", heldout)):
            chosen = [p for p in rows if ((cat, p["topic"]) in held) == (split == "heldout")]
            bucket.extend({"id": f"{split}-{cat}-{i:04d}", "category": cat, "topic": p["topic"], "prompt": p["prompt"]} for i, p in enumerate(chosen, 1))
    return train, heldout


def build_prompts(seed: int = 0, *, heldout_fraction: float = HELDOUT_FRACTION) -> list[dict]:
    """Every prompt, training ones first: ``{"id", "category", "topic", "prompt"}``.

    Ids say the split (``train-math-0001``, ``heldout-math-0001``); ``split_prompts`` on this
    list returns the two halves unchanged.
    """
    train, heldout = split_prompts(compose_prompts(seed), heldout_fraction=heldout_fraction, seed=seed)
    return train + heldout


# ---------------------------------------------------------------------------------------------
# files


def load_jsonl(path: str | Path) -> list[dict]:
    """One JSON object per non-empty line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Write through a temporary file, so a crash never leaves half a file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def count_by_category(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write the training and held-out prompt sets as JSONL.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-fraction", type=float, default=HELDOUT_FRACTION)
    ap.add_argument("--out-dir", type=Path, default=DATA_DIR)
    args = ap.parse_args(argv)
    try:
        train, heldout = split_prompts(compose_prompts(args.seed), heldout_fraction=args.heldout_fraction, seed=args.seed)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    write_jsonl(args.out_dir / TRAIN_PATH.name, train)
    write_jsonl(args.out_dir / HELDOUT_PATH.name, heldout)
    tr, he = count_by_category(train), count_by_category(heldout)
    topics_of = lambda rows, c: len({r["topic"] for r in rows if r["category"] == c})  # noqa: E731
    print(f"{'category':<14} {'train':>6} {'heldout':>8}   topics train/heldout")
    for c in tr:
        print(f"{c:<14} {tr[c]:>6} {he.get(c, 0):>8}   {topics_of(train, c)}/{topics_of(heldout, c)}")
    print(f"{'total':<14} {len(train):>6} {len(heldout):>8}")
    print(f"wrote {args.out_dir / TRAIN_PATH.name} and {args.out_dir / HELDOUT_PATH.name}")


if __name__ == "__main__":
    main()
